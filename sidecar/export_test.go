package sidecar

// RawHashOf and FingerprintOf are a route's raw hash and fingerprint.
var RawHashOf, FingerprintOf = rawHashOf, fingerprintOf

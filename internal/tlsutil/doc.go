// Package tlsutil makes and serves the certificates of a cluster: a
// throwaway certificate authority and the leaf certificates it issues
// (ECDSA P-256, short validity, crypto/x509 only), and reloaders that pick
// up replaced certificate, key and CA files without a restart.
//
// A Reloader re-reads its files when their identity, size or modification
// time change, at most once per handshake; a half-written pair (a new
// certificate with the old key) keeps the last good one until both match.
package tlsutil

package idemhttp

// Statuses exposes the status table to the external tests, which may import
// package region (which imports this package through package sidecar).
var Statuses = statuses

// Package region is the regional API node: the HTTP server that serves the
// reference payment operation, idempotency record inspection, Prometheus
// metrics and health checks, with the error contract of package idem
// (every error body is {"errorCode","message"}).
package region

// Package region is the regional API node: the HTTP server that serves the
// node's own operations (each an Operation: its endpoints, its engine
// operation, its error codes and metrics; payments is registered as one by
// package payments/paymentsnode), the coordination API, the sidecar's routes, idempotency
// record inspection, Prometheus metrics and health checks. Every request is
// authenticated and routed to its tenant's home region; every error of
// every surface is an RFC 9457 problem (application/problem+json) written
// from the node's one error table (idemhttp.Errors, extended by its
// operations' codes).
package region

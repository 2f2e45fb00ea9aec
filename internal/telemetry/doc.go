// Package telemetry holds what the service's programs share so that an
// operator can see inside them: the standard Prometheus collectors (Go
// runtime, process, build information), a collector of the store's
// connection pool and of the etcd client's requests, OpenTelemetry tracing
// (off unless an OTLP endpoint is configured, and then exported over OTLP
// gRPC), a slog handler that stamps every line of a request with the
// request's identity and trace id, and the admin listener's handler
// (pprof, expvar, build information).
//
// Nothing here registers anything globally: collectors go on the registerer
// a caller passes, tracer providers are returned to the caller, and spans
// started by library code take their tracer from the span already in the
// context (see Start), so that a node with tracing off pays for no span.
package telemetry

// Package telemetry holds what the service's packages share so that an
// operator can see inside them: span helpers over the OpenTelemetry API
// (W3C trace context in and out, child spans that cost nothing with
// tracing off), a slog handler that stamps every line of a request with
// the request's identity and trace id, and the program's version.
//
// Library packages (engine, store) import it, so it depends on the
// OpenTelemetry API and the standard library only. What a program adds
// lives apart: the OTLP exporter and the SDK in package otlp, the
// Prometheus collectors (pgx pool, etcd client) in package collectors, and
// the admin handler (pprof, expvar) in internal/admin, which only main
// packages import.
//
// Nothing here registers anything globally: spans started by library code
// take their tracer from the span already in the context (see Start), so
// that a node with tracing off pays for no span, and an entry point gets
// its tracer from an injected trace.TracerProvider (see Tracer).
package telemetry

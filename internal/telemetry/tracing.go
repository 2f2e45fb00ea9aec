package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the service's spans.
const ScopeName = "github.com/idemcoord/idem"

// propagator carries W3C trace context (traceparent, tracestate) between
// nodes and from clients.
var propagator = propagation.TraceContext{}

// Extract returns ctx with the remote span context of h's traceparent, if
// it has a valid one. Without a recording span in ctx the trace id still
// reaches the logs (LogHandler) and a forwarded request (Inject), so that a
// client's trace id joins the logs of both regions even with tracing off.
func Extract(ctx context.Context, h http.Header) context.Context {
	if h.Get("Traceparent") == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes ctx's span context into h as traceparent (and tracestate);
// without one, it leaves h alone.
func Inject(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// Tracer returns tp's tracer for the service's scope, or a no-op tracer
// when tp is nil (tracing off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// noSpan is a span that records nothing; ending it does nothing.
var noSpan = trace.SpanFromContext(context.Background())

// Start starts a child of the recording span in ctx, with that span's tracer
// provider; with none (tracing off, or a request that is not sampled) it
// returns ctx unchanged and a span that records nothing, at no cost. Library
// code starts its spans with Start, so that only the entry points (the HTTP
// server, the background workers) need a tracer provider.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, noSpan
	}
	return parent.TracerProvider().Tracer(ScopeName).Start(ctx, name,
		trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

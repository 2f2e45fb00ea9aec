package otlp_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/telemetry/otlp"
)

// TestUnreachableCollector: each form of endpoint (host:port, a URL, the
// standard environment) gives a tracer provider without connecting, and a
// collector nobody answers for loses spans without holding up a span's end
// or, past its deadline, Shutdown.
func TestUnreachableCollector(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	for _, endpoint := range []string{addr, "http://" + addr, ""} {
		tp, err := otlp.NewTracerProvider(context.Background(), otlp.Config{
			Endpoint: endpoint, Service: "idemd", Region: "eu-west", Node: "eu-west-0"})
		if err != nil {
			t.Fatalf("NewTracerProvider(%q): %v", endpoint, err)
		}
		start := time.Now()
		_, span := tp.Tracer("test").Start(context.Background(), "request")
		span.End()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = tp.Shutdown(ctx) // the span is lost: an error is expected
		cancel()
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("endpoint %q: a span and Shutdown with a 1s deadline took %v", endpoint, d)
		}
	}
}

package region_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/provider/simulator"
	"github.com/idemcoord/idem/region"
)

// TestProviderCallAndRecoveryTraced: a payment through the provider has a
// provider.charge span in the request's trace, and the provider receives
// the trace's traceparent; the recovery worker's passes are traces of their
// own.
func TestProviderCallAndRecoveryTraced(t *testing.T) {
	st, _ := storetest.New(t)
	sim, err := simulator.NewServer(simulator.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu           sync.Mutex
		traceparents []string
	)
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			traceparents = append(traceparents, r.Header.Get("Traceparent"))
			mu.Unlock()
		}
		sim.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(func() { ps.Close(); _ = sim.Close() })
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour, LockFor: 30 * time.Second,
		Provider: &provider.Client{BaseURL: ps.URL}})

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv, err := region.NewServer(region.Config{Region: "test", Tokens: map[string]string{"tok-a": "tenant-a"}, TracerProvider: tp}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	srv.StartWorkers(context.Background(), region.WorkerConfig{RecoveryInterval: 10 * time.Millisecond})
	t.Cleanup(func() { _ = srv.Close(context.Background()) })

	req, _ := http.NewRequest(http.MethodPost, hs.URL+"/payments", strings.NewReader(article))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", "traced-provider")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("payment: %d", resp.StatusCode)
	}
	waitUntil(t, "the server span and a recovery pass are exported", func() bool {
		spans := exp.GetSpans()
		return spanNamed(spans, "POST /payments") != nil && spanNamed(spans, "worker recovery") != nil
	})
	spans := exp.GetSpans()
	server, charge, pass := spanNamed(spans, "POST /payments"), spanNamed(spans, "provider.charge"), spanNamed(spans, "worker recovery")
	if charge == nil || charge.SpanContext.TraceID() != server.SpanContext.TraceID() {
		t.Fatalf("provider.charge span %+v not in the request's trace %s", charge, server.SpanContext.TraceID())
	}
	mu.Lock()
	got := strings.Join(traceparents, " ")
	mu.Unlock()
	if want := "00-" + server.SpanContext.TraceID().String() + "-"; !strings.Contains(got, want) {
		t.Errorf("the provider received traceparents %q, want one of trace %s", got, server.SpanContext.TraceID())
	}
	if pass.Parent.IsValid() || pass.SpanContext.TraceID() == server.SpanContext.TraceID() {
		t.Errorf("the recovery pass is not a trace of its own (parent %s)", pass.Parent.SpanID())
	}
}

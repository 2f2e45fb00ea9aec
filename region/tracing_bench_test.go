package region_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
)

// BenchmarkCreatePaymentTracing measures POST /payments on one node over
// PostgreSQL with tracing off (no tracer provider) and on (every request
// sampled, spans batched to an in-memory exporter): a new key each time
// (execute: the claim, the transaction and its statements are spans) and
// one key replayed.
//
//	go test ./region -run '^$' -bench BenchmarkCreatePaymentTracing -benchtime 2000x
func BenchmarkCreatePaymentTracing(b *testing.B) {
	for _, path := range []string{"execute", "replay"} {
		for _, mode := range []string{"off", "on"} {
			b.Run(path+"/"+mode, func(b *testing.B) {
				st, _ := storetest.New(b)
				cfg := region.Config{}
				var exp *tracetest.InMemoryExporter
				if mode == "on" {
					exp = tracetest.NewInMemoryExporter()
					tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					cfg.TracerProvider = tp
				}
				cfg.Tokens = map[string]string{"tok-a": "tenant-a"}
				srv, err := region.NewServer(cfg, st, paymentsnode.Operation(payments.NewService(st, payments.Config{Region: "test", Window: time.Hour}), paymentsnode.Outbox{}))
				if err != nil {
					b.Fatal(err)
				}
				hs := httptest.NewServer(srv.Handler())
				b.Cleanup(hs.Close)
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
				b.Cleanup(client.CloseIdleConnections)
				send := func(key, ref string) {
					req, _ := http.NewRequest(http.MethodPost, hs.URL+"/payments", strings.NewReader(
						`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"`+ref+`"}`))
					req.Header.Set("Authorization", "Bearer tok-a")
					req.Header.Set("Idempotency-Key", key)
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
				send("replayed", "replayed")
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if path == "replay" {
						send("replayed", "replayed")
					} else {
						k := mode + "-" + strconv.Itoa(i)
						send(k, k)
					}
					if exp != nil && i%1000 == 999 {
						exp.Reset()
					}
				}
			})
		}
	}
}

// BenchmarkHandlerTracing isolates the per-request cost of the
// observability middleware (request fields, traceparent, server span) on
// GET /healthz served in process, which touches neither the store nor the
// network.
//
//	go test ./region -run '^$' -bench BenchmarkHandlerTracing
func BenchmarkHandlerTracing(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			st, _ := storetest.New(b)
			cfg := region.Config{}
			var exp *tracetest.InMemoryExporter
			if mode == "on" {
				exp = tracetest.NewInMemoryExporter()
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				cfg.TracerProvider = tp
			}
			srv, err := region.NewServer(cfg, st, paymentsnode.Operation(payments.NewService(st, payments.Config{Region: "test"}), paymentsnode.Outbox{}))
			if err != nil {
				b.Fatal(err)
			}
			h := srv.Handler()
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i++; exp != nil && i%10000 == 0 {
					exp.Reset()
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

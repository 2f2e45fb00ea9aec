package region_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// storeStatements returns a TracerProvider for a node and a function that
// returns the store statements the node sent since it was last called (the
// store gives each statement a span named "db <verb>").
func storeStatements(t *testing.T) (*sdktrace.TracerProvider, func() []string) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, func() []string {
		var sent []string
		for _, s := range exp.GetSpans() {
			if strings.HasPrefix(s.Name, "db ") {
				sent = append(sent, s.Name)
			}
		}
		exp.Reset()
		return sent
	}
}

// TestCoordinationBeginFromMemory: with an answer cache, the coordination
// API's begin answers a settled record it has read once from memory, with
// no statement sent to the store, byte for byte as the store's answer (a
// replay and a refusal of another command alike), and counts its hits.
func TestCoordinationBeginFromMemory(t *testing.T) {
	st, _ := storetest.New(t)
	tp, statements := storeStatements(t)
	pay := func() *payments.Service {
		return payments.NewService(st, payments.Config{Region: "test", Window: time.Hour})
	}
	cached := startNode(t, st, pay(), region.Config{AnswerCacheBytes: 1 << 20, TracerProvider: tp})
	plain := startNode(t, st, pay(), region.Config{})
	const hash, other = `{"requestHash":"v1:abc"}`, `{"requestHash":"v1:abd"}`
	if a, b := cached.begin("tok-a", "charge", "mem-1", hash); a.status != http.StatusOK || b.Outcome != "execute" {
		t.Fatalf("begin = %d %s", a.status, a.body)
	}
	if a := cached.coord(http.MethodPost, "tok-a", "charge", "mem-1", "complete",
		`{"fencingToken":1,"response":{"status":201,"headers":{"Location":"/charges/c1"},"body":"eyJpZCI6ImMxIn0=","schemaVersion":"v1"}}`); a.status != http.StatusNoContent {
		t.Fatalf("complete = %d %s", a.status, a.body)
	}
	statements()
	if a, b := cached.begin("tok-a", "charge", "mem-1", hash); a.status != http.StatusOK || b.Outcome != "replay" || len(statements()) == 0 {
		t.Fatalf("first replay = %d %s; want the store's", a.status, a.body)
	}
	for _, tc := range []struct{ body, outcome string }{{hash, "replay"}, {other, "conflict"}} {
		got, g := cached.begin("tok-a", "charge", "mem-1", tc.body)
		sent := statements()
		want, _ := plain.begin("tok-a", "charge", "mem-1", tc.body)
		if g.Outcome != tc.outcome || len(sent) != 0 {
			t.Errorf("begin %s from memory = %s, sent %v; want %s and nothing sent", tc.body, got.body, sent, tc.outcome)
		}
		if got.status != want.status || !bytes.Equal(got.body, want.body) || got.header.Get("Cache-Control") != want.header.Get("Cache-Control") {
			t.Errorf("begin %s from memory = %d %s,\nthe store's %d %s", tc.body, got.status, got.body, want.status, want.body)
		}
	}
	hits := testutil.ToFloat64(mustCounter(t, cached.reg, "idem_answer_cache_hits_total"))
	misses := testutil.ToFloat64(mustCounter(t, cached.reg, "idem_answer_cache_misses_total"))
	if hits != 2 || misses < 1 {
		t.Errorf("idem_answer_cache_hits_total %v, misses %v; want 2 hits and the misses before", hits, misses)
	}
}

// TestPaymentReplayFromMemory: POST /payments replayed from memory is the
// store's replay, byte for byte (status, body, the replay contract's
// headers), and sends no statement.
func TestPaymentReplayFromMemory(t *testing.T) {
	st, _ := storetest.New(t)
	tp, statements := storeStatements(t)
	cached := startNode(t, st, payments.NewService(st, payments.Config{Region: "test", Window: time.Hour,
		AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}), region.Config{TracerProvider: tp})
	plain := newNodeOn(t, st, time.Hour)
	first := cached.pay("tok-a", "mem-pay", article)
	if first.status != http.StatusCreated {
		t.Fatalf("first POST = %d %s", first.status, first.body)
	}
	statements()
	memo := cached.pay("tok-a", "mem-pay", article)
	if sent := statements(); len(sent) != 0 {
		t.Errorf("replay from memory sent %v", sent)
	}
	stored := plain.pay("tok-a", "mem-pay", article)
	if memo.status != stored.status || !bytes.Equal(memo.body, stored.body) || !bytes.Equal(memo.body, first.body) {
		t.Errorf("replay from memory = %d %s, the store's %d %s, first %s", memo.status, memo.body, stored.status, stored.body, first.body)
	}
	for _, h := range []string{"Content-Type", "Location", "Idempotent-Replayed"} {
		if memo.header.Get(h) != stored.header.Get(h) || stored.header.Get(h) == "" {
			t.Errorf("%s from memory %q, the store's %q", h, memo.header.Get(h), stored.header.Get(h))
		}
	}
}

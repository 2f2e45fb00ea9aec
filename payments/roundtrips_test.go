package payments_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
)

// roundTrips lists the round trips of spans, in order: a lone statement's
// verb ("SELECT"), or a pipeline's statements joined by "+" (the store gives
// each statement a span named by its verb, and a pipeline a "db.pipeline"
// span over its statements').
func roundTrips(spans tracetest.SpanStubs) []string {
	pipelines := map[string]bool{}
	for _, s := range spans {
		if s.Name == "db.pipeline" {
			pipelines[s.SpanContext.SpanID().String()] = true
		}
	}
	var trips, group []string
	for _, s := range spans {
		verb, ok := strings.CutPrefix(s.Name, "db ")
		switch {
		case ok && pipelines[s.Parent.SpanID().String()]:
			group = append(group, verb)
		case ok:
			trips = append(trips, verb)
		case s.Name == "db.pipeline":
			trips = append(trips, strings.Join(group, "+"))
			group = nil
		}
	}
	return trips
}

// TestCreateRoundTrips pins the round trips of a local payment: a fresh key
// and a replay alike are one, the fast path's read and the claim statement
// pipelined in one implicit transaction (the record, payment and event; no
// BEGIN or COMMIT), the claim attempting its insert only for a free key, in
// either schema and with stored bodies too; with stored bodies, v3 needs the
// creation time before the insert: the read, then a transaction.
func TestCreateRoundTrips(t *testing.T) {
	st, _ := storetest.New(t)
	for i, tc := range []struct {
		name string
		cfg  payments.Config
		want []string
	}{
		{"fresh key, v2", payments.Config{}, []string{"SELECT+WITH"}},
		{"replay, v2", payments.Config{}, []string{"SELECT+WITH"}},
		{"fresh key, v3", payments.Config{ResponseSchema: "v3"}, []string{"SELECT+WITH"}},
		{"replay, v3", payments.Config{ResponseSchema: "v3"}, []string{"SELECT+WITH"}},
		{"fresh key, v2, stored bodies", payments.Config{StoreBodies: true}, []string{"SELECT+WITH"}},
		{"fresh key, v3, stored bodies", payments.Config{ResponseSchema: "v3", StoreBodies: true}, []string{"SELECT", "BEGIN", "SELECT", "WITH", "COMMIT"}},
		{"replay, v3, stored bodies", payments.Config{ResponseSchema: "v3", StoreBodies: true}, []string{"SELECT"}},
	} {
		// A replay retries the fresh key of the case before it.
		name := strings.Replace(tc.name, "replay", "fresh key", 1)
		key := "rt-" + strings.NewReplacer(" ", "-", ",", "").Replace(name)
		body := []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + key + `"}`)
		svc := payments.NewService(st, tc.cfg)
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		ctx, root := tp.Tracer("test").Start(context.Background(), "root")
		res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: key, Body: body})
		root.End()
		if err != nil || res.Response.Status != 201 || res.Replayed != strings.HasPrefix(tc.name, "replay") {
			t.Fatalf("%d %s: %+v, %v", i, tc.name, res, err)
		}
		got := roundTrips(exp.GetSpans())
		_ = tp.Shutdown(context.Background()) // (its exporter forgets its spans)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s sent %v, want %v", tc.name, got, tc.want)
		}
	}
}

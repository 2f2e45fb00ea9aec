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

// TestCreateRoundTrips pins the statements a local payment sends (the
// store gives each statement a span named by its verb): a fresh key is the
// fast path's read and the one claim statement as an implicit transaction
// (the record, payment and event; no BEGIN or COMMIT), in either schema; a
// replay is the read alone, the payment joined; with stored bodies, v3
// needs the creation time before the insert and takes a transaction.
func TestCreateRoundTrips(t *testing.T) {
	st, _ := storetest.New(t)
	for i, tc := range []struct {
		name string
		cfg  payments.Config
		want []string
	}{
		{"fresh key, v2", payments.Config{}, []string{"SELECT", "WITH"}},
		{"replay, v2", payments.Config{}, []string{"SELECT"}},
		{"fresh key, v3", payments.Config{ResponseSchema: "v3"}, []string{"SELECT", "WITH"}},
		{"replay, v3", payments.Config{ResponseSchema: "v3"}, []string{"SELECT"}},
		{"fresh key, v2, stored bodies", payments.Config{StoreBodies: true}, []string{"SELECT", "WITH"}},
		{"fresh key, v3, stored bodies", payments.Config{ResponseSchema: "v3", StoreBodies: true}, []string{"SELECT", "BEGIN", "SELECT", "WITH", "COMMIT"}},
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
		var got []string
		for _, s := range exp.GetSpans() {
			if v, ok := strings.CutPrefix(s.Name, "db "); ok {
				got = append(got, v)
			}
		}
		_ = tp.Shutdown(context.Background()) // (its exporter forgets its spans)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s sent %v, want %v", tc.name, got, tc.want)
		}
	}
}

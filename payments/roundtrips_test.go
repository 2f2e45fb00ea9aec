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
// store gives each statement a span named by its verb). Reading first, a
// fresh key is the fast path's read and the one claim statement as an
// implicit transaction (the record, payment and event; no BEGIN or
// COMMIT), in either schema; a replay is the read alone, the payment
// joined; with stored bodies, v3 needs the creation time before the insert
// and takes a transaction. Claiming first (and by default, on a service
// that has seen no retries), a fresh key and a replay are each the claim
// statement alone, which reads the record and its payment when the key is
// taken.
func TestCreateRoundTrips(t *testing.T) {
	st, _ := storetest.New(t)
	for i, tc := range []struct {
		name string
		cfg  payments.Config
		want []string
	}{
		{"fresh key, v2", payments.Config{ClaimOrder: payments.ReadFirst}, []string{"SELECT", "WITH"}},
		{"replay, v2", payments.Config{ClaimOrder: payments.ReadFirst}, []string{"SELECT"}},
		{"fresh key, v3", payments.Config{ResponseSchema: "v3", ClaimOrder: payments.ReadFirst}, []string{"SELECT", "WITH"}},
		{"replay, v3", payments.Config{ResponseSchema: "v3", ClaimOrder: payments.ReadFirst}, []string{"SELECT"}},
		{"fresh key, v2, stored bodies", payments.Config{StoreBodies: true, ClaimOrder: payments.ReadFirst}, []string{"SELECT", "WITH"}},
		{"fresh key, v3, stored bodies", payments.Config{ResponseSchema: "v3", StoreBodies: true, ClaimOrder: payments.ReadFirst}, []string{"SELECT", "BEGIN", "SELECT", "WITH", "COMMIT"}},
		{"fresh key, v2, claim first", payments.Config{ClaimOrder: payments.ClaimFirst}, []string{"WITH"}},
		{"replay, v2, claim first", payments.Config{ClaimOrder: payments.ClaimFirst}, []string{"WITH"}},
		{"fresh key, v3, claim first", payments.Config{ResponseSchema: "v3", ClaimOrder: payments.ClaimFirst}, []string{"WITH"}},
		{"replay, v3, claim first", payments.Config{ResponseSchema: "v3", ClaimOrder: payments.ClaimFirst}, []string{"WITH"}},
		{"fresh key, v2, stored bodies, claim first", payments.Config{StoreBodies: true, ClaimOrder: payments.ClaimFirst}, []string{"WITH"}},
		{"fresh key, v2, adaptive", payments.Config{}, []string{"WITH"}},
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

// TestProviderClaimRoundTrips: with a provider, a fresh key's claim is the
// one claim statement (the record at LOCAL_PAYMENT_CREATED with the
// payment and its event), with no read before it, and a replay of a
// settled key is that same statement alone, answered from the record it
// reads.
func TestProviderClaimRoundTrips(t *testing.T) {
	f := newFixture(t, payments.Config{})
	statements := func(fn func(ctx context.Context) (payments.Result, error)) ([]string, payments.Result) {
		t.Helper()
		var (
			res payments.Result
			err error
		)
		got := storetest.Statements(t, func(ctx context.Context) { res, err = fn(ctx) })
		if err != nil {
			t.Fatal(err)
		}
		return got, res
	}
	create := func(ctx context.Context) (payments.Result, error) {
		return f.svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "rt-provider", Body: []byte(article)})
	}
	fresh, res := statements(create)
	if res.Replayed || res.Response.Status != 201 {
		t.Fatalf("fresh key: %+v", res)
	}
	if len(fresh) == 0 || fresh[0] != "WITH" {
		t.Errorf("a fresh key's claim sent %v first, want the claim statement (WITH) and nothing before it", fresh)
	}
	replay, res := statements(create)
	if !res.Replayed || res.Response.Status != 201 {
		t.Fatalf("retry: %+v", res)
	}
	if !slices.Equal(replay, []string{"WITH"}) {
		t.Errorf("a replay sent %v, want the claim statement alone", replay)
	}
	if got := f.charges(); got.Total != 1 {
		t.Errorf("provider charges = %+v, want one", got)
	}
}

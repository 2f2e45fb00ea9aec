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
// taken. Adaptively, on a service that has seen no retries, a replay is the
// plain claim, which reads nothing, then the fast path's read.
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
		{"replay, v2, adaptive", payments.Config{}, []string{"WITH", "SELECT"}},
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
// payment and its event), with no read before it. A replay of a settled
// key is that same statement alone, answered from the record it reads,
// when the service claims first, or adaptively once it has seen retries;
// while an adaptive service sees few, its claim reads nothing (a fresh
// key's cheaper claim), and the rare retry is the claim and then the fast
// path's read.
func TestProviderClaimRoundTrips(t *testing.T) {
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
	for _, order := range []payments.ClaimOrder{payments.ClaimFirst, payments.ClaimAdaptive} {
		f := newFixture(t, payments.Config{ClaimOrder: order})
		create := func(key string) func(ctx context.Context) (payments.Result, error) {
			body := strings.Replace(article, "invoice-7781", key, 1)
			return func(ctx context.Context) (payments.Result, error) {
				return f.svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: key, Body: []byte(body)})
			}
		}
		fresh, res := statements(create("rt-provider"))
		if res.Replayed || res.Response.Status != 201 {
			t.Fatalf("order %d, fresh key: %+v", order, res)
		}
		if len(fresh) == 0 || fresh[0] != "WITH" {
			t.Errorf("order %d: a fresh key's claim sent %v first, want the claim statement (WITH) and nothing before it", order, fresh)
		}
		replay, res := statements(create("rt-provider"))
		if !res.Replayed || res.Response.Status != 201 {
			t.Fatalf("order %d, retry: %+v", order, res)
		}
		if order == payments.ClaimFirst {
			if !slices.Equal(replay, []string{"WITH"}) {
				t.Errorf("claiming first, a replay sent %v, want the claim statement alone", replay)
			}
			continue
		}
		if !slices.Equal(replay, []string{"WITH", "SELECT"}) {
			t.Errorf("adaptive with few retries seen, a replay sent %v, want the plain claim, then the fast path's read", replay)
		}
		// Retries until the service's share of them passes a tenth: the
		// replays after the plain claim count.
		for i := 0; f.svc.RetryShare() <= 0.1; i++ {
			if i > 64 {
				t.Fatalf("the retry share is %.3f after %d retries; the plain claim's retries are not counted", f.svc.RetryShare(), i)
			}
			if res, err := create("rt-provider")(context.Background()); err != nil || !res.Replayed {
				t.Fatalf("retry %d: %+v, %v", i, res, err)
			}
		}
		replay, res = statements(create("rt-provider"))
		if !res.Replayed || !slices.Equal(replay, []string{"WITH"}) {
			t.Errorf("adaptive with retries seen (share %.3f), a replay sent %v (replayed %v), want the claim statement alone",
				f.svc.RetryShare(), replay, res.Replayed)
		}
		// A fresh key is still the one statement, reading when taken.
		fresh, res = statements(create("rt-provider-2"))
		if res.Replayed || res.Response.Status != 201 || len(fresh) == 0 || fresh[0] != "WITH" {
			t.Errorf("adaptive with retries seen, a fresh key sent %v (replayed %v), want the claim statement first", fresh, res.Replayed)
		}
		if got := f.charges(); got.Total != 2 {
			t.Errorf("provider charges = %+v, want two, one per key", got)
		}
	}
}

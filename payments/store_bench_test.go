package payments_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
)

// BenchmarkCreateOnStore is Create end to end against PostgreSQL, without a
// provider: a new key (one transaction writes record, payment and event)
// and a replay of a finished key (one read).
func BenchmarkCreateOnStore(b *testing.B) {
	st, _ := storetest.New(b)
	svc := payments.NewService(st, payments.Config{Region: "bench"})
	ctx := context.Background()
	body := func(run int64, i int) []byte {
		return fmt.Appendf(nil, `{"accountId":"acc_1","amount":"10.50","currency":"EUR","merchantReference":"inv-%d-%d"}`, run, i)
	}
	b.Run("new-key", func(b *testing.B) {
		// With -count N this function runs N times: keys of its own each time.
		run := time.Now().UnixNano()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: fmt.Sprintf("k-%d-%d", run, i), Body: body(run, i)})
			if err != nil || res.Response.Status != 201 || res.Replayed {
				b.Fatalf("new key = %d replayed %v, %v", res.Response.Status, res.Replayed, err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		run := time.Now().UnixNano()
		req := payments.Request{Tenant: "tenant-a", Key: fmt.Sprintf("replayed-%d", run), Body: body(run, -1)}
		if _, err := svc.Create(ctx, req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			res, err := svc.Create(ctx, req)
			if err != nil || !res.Replayed {
				b.Fatalf("replay = %+v, %v", res, err)
			}
		}
	})
}

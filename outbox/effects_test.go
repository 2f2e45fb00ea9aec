package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/store"
)

// TestEffectGuardAcrossRegions: a payment recorded in two regions' stores
// under the same derived id (its old home, then its new home after a
// failover) emits its events in both; with an effect guard on a database
// both regions see, its ledger entries and receipt are produced once over
// both stores, by the region that claimed them first, even when both
// regions consume at the same moment. Without the guard each region
// produces them once (the test's control).
func TestEffectGuardAcrossRegions(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		name := "guarded"
		if !guarded {
			name = "unguarded"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			shared, _ := storetest.New(t)
			regions := []string{"eu-west", "us-east"}
			stores := map[string]*store.Store{}
			for _, r := range regions {
				st, _ := storetest.New(t)
				stores[r] = st
				for _, id := range []string{"pay_1", "pay_2", "pay_3"} {
					addPayment(t, st, id, "CONFIRMED")
				}
				publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
			}
			var wg sync.WaitGroup
			for _, r := range regions {
				var opts []outbox.ConsumerOption
				if guarded {
					g, err := outbox.NewEffectGuard(ctx, shared.Pool(), r)
					if err != nil {
						t.Fatal(err)
					}
					opts = append(opts, outbox.WithEffectGuard(g))
				}
				c := outbox.NewConsumers(stores[r], opts...)
				wg.Go(func() {
					for _, name := range []string{outbox.ConsumerLedger, outbox.ConsumerReceiptEmail} {
						for {
							s, err := c.ConsumeBatch(ctx, name, 2)
							if err != nil {
								t.Errorf("%s: ConsumeBatch(%s): %v", r, name, err)
								return
							}
							if s == (outbox.Stats{}) {
								break
							}
						}
					}
				})
			}
			wg.Wait()
			ledger, emails := 0, 0
			for _, r := range regions {
				ledger += count(t, stores[r], `SELECT count(*) FROM ledger_entries`)
				emails += count(t, stores[r], `SELECT count(*) FROM email_notifications`)
				sendAll(t, outbox.NewSender(stores[r], nil))
			}
			want := 1
			if !guarded {
				want = len(regions)
			}
			if ledger != 6*want || emails != 3*want {
				t.Errorf("ledger entries %d, receipts %d over both stores; want %d and %d", ledger, emails, 6*want, 3*want)
			}
			if guarded {
				// A region's own redelivery still produces nothing twice,
				// and a region that claimed keeps its claim.
				for _, r := range regions {
					g, err := outbox.NewEffectGuard(ctx, shared.Pool(), r)
					if err != nil {
						t.Fatal(err)
					}
					mine := 0
					for _, key := range []string{"email/t1/receipt_payment_pay_1", "email/t1/receipt_payment_pay_2", "email/t1/receipt_payment_pay_3"} {
						ok, err := g.Claim(ctx, key)
						if err != nil {
							t.Fatal(err)
						}
						if ok {
							mine++
						}
					}
					if got := count(t, stores[r], `SELECT count(*) FROM email_notifications`); got != mine {
						t.Errorf("%s holds %d receipts but claims %d", r, got, mine)
					}
				}
			}
		})
	}
}

package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
)

// BenchmarkConsumeBatch measures one ledger batch of 100 PaymentCreated
// deliveries, run first without savepoints (what ConsumeBatch does) and,
// as the baseline, with a savepoint per delivery from the start (what it
// did before, and still does for a batch in which a handler failed). Each
// iteration consumes a fresh batch; publishing it is not timed.
func BenchmarkConsumeBatch(b *testing.B) {
	const batch = 100
	for _, tc := range []struct {
		name string
		cons func(*outbox.Consumers) *outbox.Consumers
	}{
		{"savepoint-each", outbox.SavepointPerDelivery},
		{"savepoint-on-failure", func(c *outbox.Consumers) *outbox.Consumers { return c }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			st, _ := storetest.New(b)
			ctx := context.Background()
			pub := outbox.NewPublisher(st, outbox.PublisherConfig{})
			cons := tc.cons(outbox.NewConsumers(st))
			round := 0
			for b.Loop() {
				b.StopTimer()
				round++
				storetest.Exec(b, st, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload)
					SELECT 'evt_' || $1 || '_' || i, 't1', 'pay_' || $1 || '_' || i, 'PaymentCreated',
						jsonb_build_object('eventId', 'evt_' || $1 || '_' || i, 'type', 'PaymentCreated',
							'paymentId', 'pay_' || $1 || '_' || i, 'accountId', 'acct_1', 'amount', '12.50', 'currency', 'EUR')
					FROM generate_series(1, $2::INT8) AS i`, fmt.Sprint(round), batch)
				if n, err := pub.PublishBatch(ctx, batch); err != nil || n != batch {
					b.Fatalf("PublishBatch = %d, %v; want %d", n, err, batch)
				}
				b.StartTimer()
				s, err := cons.ConsumeBatch(ctx, outbox.ConsumerLedger, batch)
				if err != nil || s.Processed != batch {
					b.Fatalf("ConsumeBatch = %+v, %v; want %d processed", s, err, batch)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "µs/delivery")
		})
	}
}

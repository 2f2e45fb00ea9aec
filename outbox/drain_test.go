package outbox_test

import (
	"context"
	"testing"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
)

// TestDrainTakesOverALostRegionsOutbox: a region's nodes died leaving
// work in every step of its outbox (events unpublished, deliveries
// unconsumed, a receipt unsent, one under a dead sender's claim, an effect
// its guard claimed and never produced, one another region produced
// first). Drain, run with the lost region's guard, finishes every step
// once: each effect exists once over both regions, the leased receipt is
// left for after its lease, and a second Drain does nothing.
func TestDrainTakesOverALostRegionsOutbox(t *testing.T) {
	ctx := context.Background()
	shared, _ := storetest.New(t)
	lost, _ := storetest.New(t)
	guard, err := outbox.NewEffectGuard(ctx, shared.Pool(), "eu-west")
	if err != nil {
		t.Fatal(err)
	}
	other, err := outbox.NewEffectGuard(ctx, shared.Pool(), "us-east")
	if err != nil {
		t.Fatal(err)
	}
	pub := outbox.NewPublisher(lost, outbox.PublisherConfig{})
	cons := outbox.NewConsumers(lost, outbox.WithEffectGuard(guard))
	// Fully processed but for sending: pay_1 (marked sent, so the drain
	// must not send it), pay_2 (unsent),
	// pay_3 (under a sender's claim that outlives the test).
	for _, id := range []string{"pay_1", "pay_2", "pay_3"} {
		addPayment(t, lost, id, "CONFIRMED")
	}
	publishAll(t, pub)
	consumeAll(t, cons, outbox.ConsumerLedger)
	consumeAll(t, cons, outbox.ConsumerReceiptEmail)
	storetest.Exec(t, lost, `UPDATE email_notifications SET sent_at = now() WHERE payment_id = 'pay_1'`)
	storetest.Exec(t, lost, `UPDATE email_notifications SET claimed_until = now() + INTERVAL '1 hour' WHERE payment_id = 'pay_3'`)
	// Published, not consumed: pay_4, whose receipt eu-west had claimed
	// (and died before producing it), and pay_5, whose receipt us-east
	// produced first.
	for _, id := range []string{"pay_4", "pay_5"} {
		addPayment(t, lost, id, "CONFIRMED")
	}
	publishAll(t, pub)
	for key, g := range map[string]*outbox.EffectGuard{"email/t1/receipt_payment_pay_4": guard, "email/t1/receipt_payment_pay_5": other} {
		if mine, err := g.Claim(ctx, key); err != nil || !mine {
			t.Fatalf("Claim(%s) = %v, %v; want true", key, mine, err)
		}
	}
	// Not even published: pay_6.
	addPayment(t, lost, "pay_6", "CONFIRMED")

	rep, err := outbox.Drain(ctx, lost, outbox.DrainConfig{Guard: guard, Batch: 2})
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if want := (outbox.Backlog{Unpublished: 2, Pending: 3 * 2, Unsent: 1, Leased: 1}); rep.Before != want {
		t.Errorf("backlog before = %+v; want %+v", rep.Before, want)
	}
	if want := (outbox.Backlog{Leased: 1}); rep.Left != want {
		t.Errorf("backlog left = %+v; want %+v", rep.Left, want)
	}
	if rep.Published != 2 {
		t.Errorf("published %d; want 2 (pay_6's events)", rep.Published)
	}
	// pay_2, pay_4 and pay_6 sent; pay_5's receipt is us-east's.
	if rep.Sent != 3 {
		t.Errorf("sent %d; want 3", rep.Sent)
	}
	if n := count(t, lost, `SELECT count(*) FROM ledger_entries`); n != 6*2 {
		t.Errorf("ledger entries %d; want 12 (two per payment)", n)
	}
	for id, want := range map[string]int{"pay_1": 0, "pay_2": 1, "pay_3": 0, "pay_4": 1, "pay_5": 0, "pay_6": 1} {
		if n := count(t, lost, `SELECT count(*) FROM sent_emails WHERE dedupe_key = $1`, "receipt_payment_"+id); n != want {
			t.Errorf("%s: receipt sent %d times; want %d", id, n, want)
		}
	}
	again, err := outbox.Drain(ctx, lost, outbox.DrainConfig{Guard: guard})
	if err != nil {
		t.Fatalf("second Drain: %v", err)
	}
	if again.Published+again.Sent+again.Consumed.Processed+again.Consumed.Duplicates != 0 {
		t.Errorf("second Drain did %+v; want nothing", again)
	}
}

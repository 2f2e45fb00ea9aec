package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const tenant = "t1"

// paymentEvent builds an event the way package payments does.
func paymentEvent(paymentID, typ, suffix string) payments.Event {
	id := "evt_" + paymentID + "_" + suffix
	payload, _ := json.Marshal(map[string]string{"eventId": id, "type": typ, "paymentId": paymentID,
		"accountId": "acct_" + paymentID, "amount": "12.50", "currency": "EUR"})
	return payments.Event{ID: id, Tenant: tenant, AggregateID: paymentID, Type: typ, Payload: payload}
}

// addPayment writes a payment and its PaymentCreated event, then, for
// status CONFIRMED or DECLINED, the status change and its event: each in one
// transaction, as the payments code does.
func addPayment(t testing.TB, st *store.Store, id, status string) {
	t.Helper()
	ctx := context.Background()
	p := payments.Payment{Tenant: tenant, ID: id, AccountID: "acct_" + id, AmountMinor: 1250, Currency: "EUR",
		MerchantReference: "ref_" + id, Channel: "web", Status: "PENDING", ProviderKey: "provider_payment_" + id}
	if err := st.ExecTx(ctx, func(tx pgx.Tx) error {
		return payments.InsertPaymentOnly(ctx, tx, p, paymentEvent(id, outbox.EventPaymentCreated, "created"))
	}); err != nil {
		t.Errorf("insert payment %s: %v", id, err)
		return
	}
	var ev payments.Event
	switch status {
	case "PENDING":
		return
	case "CONFIRMED":
		ev = paymentEvent(id, outbox.EventPaymentConfirmed, "confirmed")
	case "DECLINED":
		ev = paymentEvent(id, outbox.EventPaymentDeclined, "declined")
	}
	if err := st.ExecTx(ctx, func(tx pgx.Tx) error {
		return payments.SetPaymentStatus(ctx, tx, tenant, id, status, &ev)
	}); err != nil {
		t.Errorf("set payment %s %s: %v", id, status, err)
	}
}

func publishAll(t *testing.T, p *outbox.Publisher) int {
	t.Helper()
	total := 0
	for {
		n, err := p.PublishBatch(context.Background(), 7)
		if err != nil {
			t.Fatalf("PublishBatch: %v", err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}

func consumeAll(t *testing.T, c *outbox.Consumers, name string) outbox.Stats {
	t.Helper()
	var sum outbox.Stats
	for {
		s, err := c.ConsumeBatch(context.Background(), name, 5)
		if err != nil {
			t.Fatalf("ConsumeBatch(%s): %v", name, err)
		}
		if s == (outbox.Stats{}) {
			return sum
		}
		sum = add(sum, s)
	}
}

func add(a, b outbox.Stats) outbox.Stats {
	return outbox.Stats{Processed: a.Processed + b.Processed, Duplicates: a.Duplicates + b.Duplicates,
		Rejected: a.Rejected + b.Rejected, Failed: a.Failed + b.Failed}
}

func sendAll(t *testing.T, s *outbox.Sender) int {
	t.Helper()
	total := 0
	for {
		n, err := s.SendBatch(context.Background(), 4)
		if err != nil {
			t.Fatalf("SendBatch: %v", err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}

func count(t testing.TB, st *store.Store, query string, args ...any) int {
	t.Helper()
	return storetest.Count(t, st, query, args...)
}

// checkExactlyOnceEffects checks the consumers' and sender's effects for
// payments of which confirmed were confirmed and created were created.
func checkExactlyOnceEffects(t *testing.T, st *store.Store, created, confirmed int) {
	t.Helper()
	for _, c := range []struct {
		what  string
		query string
		want  int
	}{
		{"unpublished events", `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`, 0},
		{"unprocessed deliveries", `SELECT count(*) FROM queue_messages WHERE processed_at IS NULL`, 0},
		{"ledger entries", `SELECT count(*) FROM ledger_entries`, created + confirmed},
		{"payment_created entries", `SELECT count(*) FROM ledger_entries WHERE entry_type = 'payment_created'
			AND entry_id = 'ledger_payment_created_' || source_payment_id AND source_event_id = 'evt_' || source_payment_id || '_created'`, created},
		{"payment_confirmed entries", `SELECT count(*) FROM ledger_entries WHERE entry_type = 'payment_confirmed'
			AND entry_id = 'ledger_payment_' || source_payment_id AND source_event_id = 'evt_' || source_payment_id || '_confirmed'`, confirmed},
		{"confirmed entries of unconfirmed payments", `SELECT count(*) FROM ledger_entries l JOIN payments p ON p.payment_id = l.source_payment_id
			WHERE l.entry_type = 'payment_confirmed' AND p.status <> 'CONFIRMED'`, 0},
		{"email notifications", `SELECT count(*) FROM email_notifications`, confirmed},
		{"notifications of confirmed payments", `SELECT count(*) FROM email_notifications n JOIN payments p ON p.payment_id = n.payment_id
			WHERE p.status = 'CONFIRMED' AND n.dedupe_key = 'receipt_payment_' || p.payment_id AND n.sent_at IS NOT NULL`, confirmed},
		{"sent emails", `SELECT count(*) FROM sent_emails`, confirmed},
		{"distinct sent emails", `SELECT count(DISTINCT dedupe_key) FROM sent_emails`, confirmed},
		{"ledger inbox rows", `SELECT count(*) FROM consumer_inbox WHERE consumer_name = 'ledger' AND status = 'PROCESSED'`, created + confirmed},
		{"receipt inbox rows", `SELECT count(*) FROM consumer_inbox WHERE consumer_name = 'receipt-email' AND status = 'PROCESSED'`, confirmed},
		{"inbox rows without a delivery", `SELECT count(*) FROM consumer_inbox i WHERE NOT EXISTS (
			SELECT 1 FROM queue_messages q WHERE q.consumer_name = i.consumer_name AND q.message_id = i.message_id)`, 0},
	} {
		if got := count(t, st, c.query); got != c.want {
			t.Errorf("%s = %d, want %d", c.what, got, c.want)
		}
	}
}

// checkDeliveries checks that every event a consumer subscribes to was
// enqueued exactly copies times for it, and nothing else was.
func checkDeliveries(t *testing.T, st *store.Store, copies int) {
	t.Helper()
	q := `SELECT count(*) FROM (
		SELECT e.event_id, s.consumer_name, (SELECT count(*) FROM queue_messages q
			WHERE q.message_id = e.event_id AND q.consumer_name = s.consumer_name) AS n
		FROM outbox_events e JOIN (VALUES ('ledger', 'PaymentCreated'), ('ledger', 'PaymentConfirmed'),
			('receipt-email', 'PaymentConfirmed')) AS s (consumer_name, event_type) ON s.event_type = e.event_type
	) AS d WHERE n <> $1`
	if got := count(t, st, q, copies); got != 0 {
		t.Errorf("%d (event, consumer) pairs not delivered exactly %d times", got, copies)
	}
	if got := count(t, st, `SELECT count(*) FROM queue_messages q JOIN outbox_events e ON e.event_id = q.message_id
		WHERE e.event_type = 'PaymentDeclined' OR (q.consumer_name = 'receipt-email' AND e.event_type <> 'PaymentConfirmed')`); got != 0 {
		t.Errorf("%d deliveries to consumers not subscribed to the event", got)
	}
}

func TestDuplicateDeliveryHasExactlyOnceEffects(t *testing.T) {
	st, _ := storetest.New(t)
	statuses := []string{"CONFIRMED", "PENDING", "CONFIRMED", "DECLINED", "CONFIRMED", "CONFIRMED", "PENDING", "DECLINED", "CONFIRMED", "CONFIRMED"}
	confirmed := 0
	for i, s := range statuses {
		addPayment(t, st, fmt.Sprintf("pay_%02d", i), s)
		if s == "CONFIRMED" {
			confirmed++
		}
	}
	created, events := len(statuses), len(statuses)+confirmed+2

	pub := outbox.NewPublisher(st, outbox.PublisherConfig{Duplicate: true})
	if n := publishAll(t, pub); n != events {
		t.Fatalf("published %d events, want %d", n, events)
	}
	checkDeliveries(t, st, 2)

	cons := outbox.NewConsumers(st)
	ledger := consumeAll(t, cons, outbox.ConsumerLedger)
	if want := (outbox.Stats{Processed: created + confirmed, Duplicates: created + confirmed}); ledger != want {
		t.Errorf("ledger stats = %+v, want %+v", ledger, want)
	}
	receipt := consumeAll(t, cons, outbox.ConsumerReceiptEmail)
	if want := (outbox.Stats{Processed: confirmed, Duplicates: confirmed}); receipt != want {
		t.Errorf("receipt-email stats = %+v, want %+v", receipt, want)
	}
	// Persisted before sent: nothing has been sent yet.
	if n := count(t, st, `SELECT count(*) FROM sent_emails`); n != 0 {
		t.Errorf("%d emails sent by the consumer, want 0", n)
	}
	if n := sendAll(t, outbox.NewSender(st, nil)); n != confirmed {
		t.Errorf("sent %d emails, want %d", n, confirmed)
	}
	checkExactlyOnceEffects(t, st, created, confirmed)

	// Redelivering everything again changes nothing.
	storetest.Exec(t, st, `UPDATE outbox_events SET published_at = NULL`)
	if n := publishAll(t, pub); n != events {
		t.Fatalf("republished %d events, want %d", n, events)
	}
	if s := add(consumeAll(t, cons, outbox.ConsumerLedger), consumeAll(t, cons, outbox.ConsumerReceiptEmail)); s.Processed != 0 || s.Duplicates != 2*(created+2*confirmed) {
		t.Errorf("redelivery stats = %+v, want only %d duplicates", s, 2*(created+2*confirmed))
	}
	if n := sendAll(t, outbox.NewSender(st, nil)); n != 0 {
		t.Errorf("redelivery sent %d emails, want 0", n)
	}
	checkExactlyOnceEffects(t, st, created, confirmed)
}

func TestConcurrentPublishersAndConsumers(t *testing.T) {
	for _, dup := range []bool{false, true} {
		t.Run(fmt.Sprintf("duplicate=%v", dup), func(t *testing.T) {
			t.Parallel()
			testConcurrent(t, dup)
		})
	}
}

func testConcurrent(t *testing.T, duplicate bool) {
	st, _ := storetest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const payments = 100
	copies := 1
	if duplicate {
		copies = 2
	}

	var (
		writersDone, publishersDone, consumersDone atomic.Bool
		mu                                         sync.Mutex
		stats                                      = map[string]outbox.Stats{}
		published, sent                            atomic.Int64
	)
	// loop runs step until it makes no progress and finished() holds.
	loop := func(what string, step func() (bool, error), finished func() bool) {
		for ctx.Err() == nil {
			progress, err := step()
			if err != nil {
				t.Errorf("%s: %v", what, err)
				return
			}
			if !progress {
				if finished() {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
		t.Errorf("%s: %v", what, ctx.Err())
	}

	var writers, publishers, consumers, senders sync.WaitGroup
	for w := range 2 {
		writers.Go(func() {
			for i := w; i < payments; i += 2 {
				status := "PENDING"
				if i%2 == 0 {
					status = "CONFIRMED"
				}
				addPayment(t, st, fmt.Sprintf("pay_%03d", i), status)
			}
		})
	}
	for i := range 2 {
		p := outbox.NewPublisher(st, outbox.PublisherConfig{Duplicate: duplicate})
		publishers.Go(func() {
			loop(fmt.Sprintf("publisher %d", i), func() (bool, error) {
				n, err := p.PublishBatch(ctx, 5)
				published.Add(int64(n))
				return n > 0, err
			}, func() bool {
				return writersDone.Load() && count(t, st, `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`) == 0
			})
		})
	}
	for _, name := range []string{outbox.ConsumerLedger, outbox.ConsumerReceiptEmail} {
		for i := range 2 {
			c := outbox.NewConsumers(st)
			consumers.Go(func() {
				loop(fmt.Sprintf("consumer %s %d", name, i), func() (bool, error) {
					s, err := c.ConsumeBatch(ctx, name, 8)
					mu.Lock()
					stats[name] = add(stats[name], s)
					mu.Unlock()
					return s != (outbox.Stats{}), err
				}, func() bool {
					return publishersDone.Load() &&
						count(t, st, `SELECT count(*) FROM queue_messages WHERE consumer_name = $1 AND processed_at IS NULL`, name) == 0
				})
			})
		}
	}
	for i := range 2 {
		s := outbox.NewSender(st, nil)
		senders.Go(func() {
			loop(fmt.Sprintf("sender %d", i), func() (bool, error) {
				n, err := s.SendBatch(ctx, 5)
				sent.Add(int64(n))
				return n > 0, err
			}, func() bool {
				return consumersDone.Load() && count(t, st, `SELECT count(*) FROM email_notifications WHERE sent_at IS NULL`) == 0
			})
		})
	}
	writers.Wait()
	writersDone.Store(true)
	publishers.Wait()
	publishersDone.Store(true)
	consumers.Wait()
	consumersDone.Store(true)
	senders.Wait()

	const confirmed = payments / 2
	if got := published.Load(); got != payments+confirmed {
		t.Errorf("published %d events, want %d (each once)", got, payments+confirmed)
	}
	if got := sent.Load(); got != confirmed {
		t.Errorf("sent %d emails, want %d", got, confirmed)
	}
	checkDeliveries(t, st, copies)
	if want := (outbox.Stats{Processed: payments + confirmed, Duplicates: (copies - 1) * (payments + confirmed)}); stats[outbox.ConsumerLedger] != want {
		t.Errorf("ledger stats = %+v, want %+v", stats[outbox.ConsumerLedger], want)
	}
	if want := (outbox.Stats{Processed: confirmed, Duplicates: (copies - 1) * confirmed}); stats[outbox.ConsumerReceiptEmail] != want {
		t.Errorf("receipt-email stats = %+v, want %+v", stats[outbox.ConsumerReceiptEmail], want)
	}
	checkExactlyOnceEffects(t, st, payments, confirmed)
}

func TestHandlerFailureLeavesMessagePending(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	for i := range 3 {
		addPayment(t, st, fmt.Sprintf("pay_%d", i), "PENDING")
	}
	const bad = "evt_pay_1_created"
	boom := errors.New("boom")
	var failing atomic.Bool
	failing.Store(true)
	// flaky writes the ledger entry, then fails for message bad.
	flaky := func(ctx context.Context, q store.Querier, m outbox.Message) error {
		if err := outbox.HandleLedger(ctx, q, m); err != nil {
			return err
		}
		if m.ID == bad && failing.Load() {
			return boom
		}
		return nil
	}
	pub := outbox.NewPublisher(st, outbox.PublisherConfig{Subscriptions: map[string][]string{"flaky": {outbox.EventPaymentCreated}}})
	if n := publishAll(t, pub); n != 3 {
		t.Fatalf("published %d, want 3", n)
	}
	cons := outbox.NewConsumers(st, outbox.WithHandler("flaky", flaky))

	s, err := cons.ConsumeBatch(ctx, "flaky", 10)
	if want := (outbox.Stats{Processed: 2, Failed: 1}); s != want {
		t.Errorf("stats = %+v, want %+v", s, want)
	}
	var herr *outbox.HandlerError
	if !errors.As(err, &herr) || herr.MessageID != bad || herr.Consumer != "flaky" || !errors.Is(err, boom) {
		t.Fatalf("ConsumeBatch error = %v, want a *HandlerError for %s wrapping boom", err, bad)
	}
	check := func(what, query string, want int) {
		t.Helper()
		if got := count(t, st, query, bad); got != want {
			t.Errorf("%s = %d, want %d", what, got, want)
		}
	}
	check("pending deliveries of the failed message", `SELECT count(*) FROM queue_messages WHERE message_id = $1 AND processed_at IS NULL`, 1)
	check("other pending deliveries", `SELECT count(*) FROM queue_messages WHERE message_id <> $1 AND processed_at IS NULL`, 0)
	check("inbox rows of the failed message", `SELECT count(*) FROM consumer_inbox WHERE message_id = $1`, 0)
	check("other inbox rows", `SELECT count(*) FROM consumer_inbox WHERE message_id <> $1`, 2)
	check("effects of the failed message", `SELECT count(*) FROM ledger_entries WHERE source_event_id = $1`, 0)
	check("other effects", `SELECT count(*) FROM ledger_entries WHERE source_event_id <> $1`, 2)

	// Still failing: retried, still pending.
	if s, err := cons.ConsumeBatch(ctx, "flaky", 10); s != (outbox.Stats{Failed: 1}) || !errors.Is(err, boom) {
		t.Errorf("retry = %+v, %v; want 1 failure wrapping boom", s, err)
	}
	failing.Store(false)
	if s, err := cons.ConsumeBatch(ctx, "flaky", 10); s != (outbox.Stats{Processed: 1}) || err != nil {
		t.Errorf("after the fix = %+v, %v; want 1 processed", s, err)
	}
	check("pending deliveries", `SELECT count(*) FROM queue_messages WHERE processed_at IS NULL AND $1 <> ''`, 0)
	check("inbox rows", `SELECT count(*) FROM consumer_inbox WHERE status = 'PROCESSED' AND $1 <> ''`, 3)
	check("effects of the failed message", `SELECT count(*) FROM ledger_entries WHERE source_event_id = $1`, 1)
}

func TestFatalHandlerErrorAbortsBatch(t *testing.T) {
	st, _ := storetest.New(t)
	for i := range 3 {
		addPayment(t, st, fmt.Sprintf("pay_%d", i), "PENDING")
	}
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
	cancelled := func(ctx context.Context, q store.Querier, m outbox.Message) error {
		if err := outbox.HandleLedger(ctx, q, m); err != nil {
			return err
		}
		if m.ID == "evt_pay_2_created" {
			return fmt.Errorf("gave up: %w", context.Canceled)
		}
		return nil
	}
	cons := outbox.NewConsumers(st, outbox.WithHandler(outbox.ConsumerLedger, cancelled))
	s, err := cons.ConsumeBatch(context.Background(), outbox.ConsumerLedger, 10)
	if !errors.Is(err, context.Canceled) || s != (outbox.Stats{}) {
		t.Errorf("ConsumeBatch = %+v, %v; want zero stats and context.Canceled", s, err)
	}
	for _, q := range []string{`SELECT count(*) FROM consumer_inbox`, `SELECT count(*) FROM ledger_entries`,
		`SELECT count(*) FROM queue_messages WHERE processed_at IS NOT NULL`} {
		if n := count(t, st, q); n != 0 {
			t.Errorf("%s = %d, want 0: nothing of an aborted batch commits", q, n)
		}
	}
}

func TestRejectedMessageIsDeadLettered(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	addPayment(t, st, "pay_ok", "PENDING")
	storetest.Exec(t, st, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload)
		VALUES ('evt_bad', $1, 'pay_bad', 'PaymentCreated', '{"eventId": "evt_bad"}')`, tenant)
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{Duplicate: true}))
	s := consumeAll(t, outbox.NewConsumers(st), outbox.ConsumerLedger)
	if want := (outbox.Stats{Processed: 1, Rejected: 1, Duplicates: 2}); s != want {
		t.Errorf("stats = %+v, want %+v", s, want)
	}
	var status, code string
	if err := st.Pool().QueryRow(ctx, `SELECT status, error_code FROM consumer_inbox WHERE consumer_name = 'ledger' AND message_id = 'evt_bad'`).Scan(&status, &code); err != nil {
		t.Fatalf("inbox row of the rejected message: %v", err)
	}
	if status != outbox.InboxRejected || code != outbox.RejectMalformedPayload {
		t.Errorf("inbox row = %s %s, want %s %s", status, code, outbox.InboxRejected, outbox.RejectMalformedPayload)
	}
	if n := count(t, st, `SELECT count(*) FROM queue_messages WHERE processed_at IS NULL`); n != 0 {
		t.Errorf("%d deliveries pending, want 0", n)
	}
	if n := count(t, st, `SELECT count(*) FROM ledger_entries`); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
}

func TestConsumeBatchArguments(t *testing.T) {
	st, _ := storetest.New(t)
	cons := outbox.NewConsumers(st)
	if _, err := cons.ConsumeBatch(context.Background(), "nobody", 1); !errors.Is(err, outbox.ErrUnknownConsumer) {
		t.Errorf("unknown consumer: err = %v, want ErrUnknownConsumer", err)
	}
	if _, err := cons.ConsumeBatch(context.Background(), outbox.ConsumerLedger, 0); err == nil {
		t.Error("limit 0: no error")
	}
	if _, err := outbox.NewPublisher(st, outbox.PublisherConfig{}).PublishBatch(context.Background(), 0); err == nil {
		t.Error("publish limit 0: no error")
	}
	if _, err := outbox.NewSender(st, nil).SendBatch(context.Background(), -1); err == nil {
		t.Error("send limit -1: no error")
	}
}

func TestLag(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	pub := outbox.NewPublisher(st, outbox.PublisherConfig{})
	lag := func() time.Duration {
		t.Helper()
		d, err := pub.Lag(ctx)
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		return d
	}
	if d := lag(); d != 0 {
		t.Errorf("lag without events = %v, want 0", d)
	}
	addPayment(t, st, "pay_1", "CONFIRMED")
	storetest.Exec(t, st, `UPDATE outbox_events SET created_at = now() - INTERVAL '90 seconds' WHERE event_id = 'evt_pay_1_created'`)
	if d := lag(); d < 90*time.Second || d > 10*time.Minute {
		t.Errorf("lag = %v, want about 90s (the oldest unpublished event's age)", d)
	}
	if n, err := pub.PublishBatch(ctx, 1); n != 1 || err != nil {
		t.Fatalf("PublishBatch(1) = %d, %v", n, err)
	}
	if d := lag(); d <= 0 || d >= 90*time.Second {
		t.Errorf("lag with one young event unpublished = %v, want > 0 and < 90s", d)
	}
	publishAll(t, pub)
	if d := lag(); d != 0 {
		t.Errorf("lag after publishing = %v, want 0", d)
	}
}

// failingMailer fails for one dedupe key and otherwise sends through next.
type failingMailer struct {
	key  string
	next outbox.Mailer
}

func (m failingMailer) Send(ctx context.Context, e outbox.Email) error {
	if e.DedupeKey == m.key {
		return errors.New("mailbox unavailable")
	}
	return m.next.Send(ctx, e)
}

func TestSenderFailureAndClaims(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	for i := range 3 {
		addPayment(t, st, fmt.Sprintf("pay_%d", i), "CONFIRMED")
	}
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
	consumeAll(t, outbox.NewConsumers(st), outbox.ConsumerReceiptEmail)

	// An email claimed by another sender whose lease still runs is left alone.
	storetest.Exec(t, st, `UPDATE email_notifications SET claimed_until = now() + INTERVAL '1 hour' WHERE dedupe_key = 'receipt_payment_pay_2'`)
	sink := outbox.NewSinkMailer(st)
	n, err := outbox.NewSender(st, failingMailer{key: "receipt_payment_pay_0", next: sink}).SendBatch(ctx, 10)
	if n != 1 || err == nil {
		t.Errorf("SendBatch = %d, %v; want 1 sent and an error", n, err)
	}
	var (
		attempts int
		lastErr  *string
		claimed  *time.Time
	)
	if err := st.Pool().QueryRow(ctx, `SELECT attempts, last_error, claimed_until FROM email_notifications
		WHERE dedupe_key = 'receipt_payment_pay_0' AND sent_at IS NULL`).Scan(&attempts, &lastErr, &claimed); err != nil {
		t.Fatalf("failed notification: %v", err)
	}
	if attempts != 1 || lastErr == nil || claimed != nil {
		t.Errorf("failed notification: attempts %d, last_error %v, claimed_until %v; want 1, the error, released", attempts, lastErr, claimed)
	}
	if n := count(t, st, `SELECT count(*) FROM sent_emails WHERE dedupe_key = 'receipt_payment_pay_1'`); n != 1 {
		t.Errorf("pay_1 sent %d times, want 1", n)
	}

	// The failed one is retried; the claimed one waits for its lease.
	if n, err := outbox.NewSender(st, sink).SendBatch(ctx, 10); n != 1 || err != nil {
		t.Errorf("retry SendBatch = %d, %v; want 1, nil", n, err)
	}
	storetest.Exec(t, st, `UPDATE email_notifications SET claimed_until = now() - INTERVAL '1 second' WHERE dedupe_key = 'receipt_payment_pay_2'`)
	if n, err := outbox.NewSender(st, sink).SendBatch(ctx, 10); n != 1 || err != nil {
		t.Errorf("SendBatch after the lease = %d, %v; want 1, nil", n, err)
	}
	if n := count(t, st, `SELECT count(*) FROM sent_emails`); n != 3 {
		t.Errorf("%d emails sent, want 3", n)
	}
	if n := count(t, st, `SELECT count(*) FROM email_notifications WHERE sent_at IS NULL OR claimed_until IS NOT NULL`); n != 0 {
		t.Errorf("%d notifications unsent or still claimed, want 0", n)
	}
}

func TestHandlerSQLErrorRollsBackToSavepoint(t *testing.T) {
	st, _ := storetest.New(t)
	for i := range 3 {
		addPayment(t, st, fmt.Sprintf("pay_%d", i), "PENDING")
	}
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
	// For one message the handler's statement fails, which aborts the
	// transaction until the savepoint is rolled back.
	divide := func(ctx context.Context, q store.Querier, m outbox.Message) error {
		if err := outbox.HandleLedger(ctx, q, m); err != nil {
			return err
		}
		if m.ID == "evt_pay_0_created" {
			_, err := q.Exec(ctx, `SELECT 1 / 0`)
			return err
		}
		return nil
	}
	cons := outbox.NewConsumers(st, outbox.WithHandler(outbox.ConsumerLedger, divide))
	s, err := cons.ConsumeBatch(context.Background(), outbox.ConsumerLedger, 10)
	var herr *outbox.HandlerError
	if s != (outbox.Stats{Processed: 2, Failed: 1}) || !errors.As(err, &herr) || herr.MessageID != "evt_pay_0_created" {
		t.Errorf("ConsumeBatch = %+v, %v; want 2 processed and a HandlerError for evt_pay_0_created", s, err)
	}
	if n := count(t, st, `SELECT count(*) FROM ledger_entries WHERE source_payment_id <> 'pay_0'`); n != 2 {
		t.Errorf("%d ledger entries of the other messages, want 2", n)
	}
	if n := count(t, st, `SELECT count(*) FROM ledger_entries WHERE source_payment_id = 'pay_0'`) +
		count(t, st, `SELECT count(*) FROM consumer_inbox WHERE message_id = 'evt_pay_0_created'`); n != 0 {
		t.Errorf("the failed message left %d rows, want 0", n)
	}
}

// cancellingMailer cancels the batch's context while a send is under way,
// then sends through next with the context it was given.
type cancellingMailer struct {
	cancel context.CancelFunc
	next   outbox.Mailer
}

func (m cancellingMailer) Send(ctx context.Context, e outbox.Email) error {
	m.cancel()
	return m.next.Send(ctx, e)
}

// TestSenderShutdownMidSend: a node shutting down (the batch's context
// ends) while an email is being sent lets that send finish and records it
// sent; it is not released for another sender to send again, and the
// emails not yet begun stay for later.
func TestSenderShutdownMidSend(t *testing.T) {
	st, _ := storetest.New(t)
	for i := range 2 {
		addPayment(t, st, fmt.Sprintf("pay_%d", i), "CONFIRMED")
	}
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
	consumeAll(t, outbox.NewConsumers(st), outbox.ConsumerReceiptEmail)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := outbox.NewSender(st, cancellingMailer{cancel: cancel, next: outbox.NewSinkMailer(st)}).SendBatch(ctx, 10)
	if n != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("SendBatch = %d, %v; want 1 sent, and the other not attempted", n, err)
	}
	if got := count(t, st, `SELECT count(*) FROM email_notifications WHERE sent_at IS NOT NULL`); got != 1 {
		t.Errorf("%d notifications marked sent, want the one whose send had begun", got)
	}
	if n := sendAll(t, outbox.NewSender(st, nil)); n != 1 {
		t.Errorf("the next sender sent %d, want only the one never attempted", n)
	}
	if got := count(t, st, `SELECT count(*) FROM sent_emails`); got != 2 {
		t.Errorf("%d emails sent in all, want 2 (one each)", got)
	}
}

// TestBatchesRunAtReadCommitted: a consumer's batch (and so its handler)
// runs at READ COMMITTED, not at the store's SERIALIZABLE default: its
// correctness rests on row locks and unique constraints, and serializable
// queue batches fill PostgreSQL's shared predicate lock table beside the
// request traffic ("out of shared memory" for every serializable statement).
func TestBatchesRunAtReadCommitted(t *testing.T) {
	st, _ := storetest.New(t)
	addPayment(t, st, "pay_rc", "PENDING")
	publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
	var isolation string
	cons := outbox.NewConsumers(st, outbox.WithHandler(outbox.ConsumerLedger, func(ctx context.Context, q store.Querier, m outbox.Message) error {
		if err := q.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&isolation); err != nil {
			return err
		}
		return outbox.HandleLedger(ctx, q, m)
	}))
	if s, err := cons.ConsumeBatch(context.Background(), outbox.ConsumerLedger, 10); err != nil || s.Processed != 1 {
		t.Fatalf("ConsumeBatch = %+v, %v; want 1 processed", s, err)
	}
	if isolation != "read committed" {
		t.Errorf("the batch ran at %q, want read committed", isolation)
	}
}

// lostAnswerMailer sends through the sink, then reports a failure, as a
// mail system whose connection dropped after it took the email.
type lostAnswerMailer struct{ *outbox.SinkMailer }

func (m lostAnswerMailer) Send(ctx context.Context, e outbox.Email) error {
	if err := m.SinkMailer.Send(ctx, e); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// sendOnly hides a mailer's SentLookup.
type sendOnly struct{ outbox.Mailer }

// TestSenderLooksUpALostSend: an email whose send went out but whose answer
// was lost is released and claimed again; on that attempt a mailer that can
// say whether it sent it (SentLookup) is asked first, and the email is
// recorded as sent without a second send. A mailer that cannot be asked
// sends it twice (at-least-once), which is what the lookup prevents.
func TestSenderLooksUpALostSend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry func(*outbox.SinkMailer) outbox.Mailer
		sends int
	}{
		{"with lookup", func(m *outbox.SinkMailer) outbox.Mailer { return m }, 1},
		{"without lookup", func(m *outbox.SinkMailer) outbox.Mailer { return sendOnly{m} }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := storetest.New(t)
			ctx := context.Background()
			addPayment(t, st, "pay_lost", "CONFIRMED")
			publishAll(t, outbox.NewPublisher(st, outbox.PublisherConfig{}))
			consumeAll(t, outbox.NewConsumers(st), outbox.ConsumerReceiptEmail)
			sink := outbox.NewSinkMailer(st)
			if n, err := outbox.NewSender(st, lostAnswerMailer{sink}).SendBatch(ctx, 10); n != 0 || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("first SendBatch = %d, %v; want 0 and the lost answer", n, err)
			}
			if n, err := outbox.NewSender(st, tc.retry(sink)).SendBatch(ctx, 10); n != 1 || err != nil {
				t.Fatalf("second SendBatch = %d, %v; want 1 recorded as sent", n, err)
			}
			if n := count(t, st, `SELECT count(*) FROM sent_emails WHERE dedupe_key = 'receipt_payment_pay_lost'`); n != tc.sends {
				t.Errorf("the receipt went out %d times, want %d", n, tc.sends)
			}
			if n := count(t, st, `SELECT count(*) FROM email_notifications WHERE sent_at IS NULL OR attempts <> 2`); n != 0 {
				t.Errorf("%d notifications unsent or not at attempt 2", n)
			}
		})
	}
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/store"
)

// Event types of the reference payment domain's outbox.
const (
	EventPaymentCreated   = "PaymentCreated"
	EventPaymentConfirmed = "PaymentConfirmed"
	EventPaymentDeclined  = "PaymentDeclined"
)

// Names of the built-in consumers.
const (
	// ConsumerLedger writes a ledger entry per PaymentCreated and
	// PaymentConfirmed event.
	ConsumerLedger = "ledger"
	// ConsumerReceiptEmail persists a receipt email per PaymentConfirmed
	// event, for a Sender to send.
	ConsumerReceiptEmail = "receipt-email"
)

// errInvalidLimit is returned (wrapped) for a batch limit below 1.
var errInvalidLimit = errors.New("batch limit must be positive")

// DefaultSubscriptions returns which event types each built-in consumer
// receives: ledger gets PaymentCreated and PaymentConfirmed, receipt-email
// gets PaymentConfirmed. The map is new on every call.
func DefaultSubscriptions() map[string][]string {
	return map[string][]string{
		ConsumerLedger:       {EventPaymentCreated, EventPaymentConfirmed},
		ConsumerReceiptEmail: {EventPaymentConfirmed},
	}
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Duplicate enqueues every delivery twice: the "deliver every event
	// twice" fault that tests and the chaos harness inject to show that
	// consumers deduplicate.
	Duplicate bool
	// Subscriptions maps a consumer name to the event types it receives.
	// Nil means DefaultSubscriptions(). An event no consumer subscribes to
	// is marked published without deliveries.
	Subscriptions map[string][]string
}

// Publisher moves outbox events into the consumers' queue. It needs no
// leader: any number of Publishers, on any nodes, may run at once. It is safe
// for concurrent use.
type Publisher struct {
	st     *store.Store
	copies int
	// consumers[i] subscribes to eventTypes[i].
	consumers, eventTypes []string
}

// NewPublisher returns a Publisher over st's outbox_events. cfg is copied.
func NewPublisher(st *store.Store, cfg PublisherConfig) *Publisher {
	subs := cfg.Subscriptions
	if subs == nil {
		subs = DefaultSubscriptions()
	}
	p := &Publisher{st: st, copies: 1}
	if cfg.Duplicate {
		p.copies = 2
	}
	names := make([]string, 0, len(subs))
	for name := range subs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		seen := make(map[string]bool)
		for _, typ := range subs[name] {
			if !seen[typ] {
				seen[typ] = true
				p.consumers, p.eventTypes = append(p.consumers, name), append(p.eventTypes, typ)
			}
		}
	}
	return p
}

// PublishBatch publishes up to limit of the oldest unpublished events and
// returns how many it published. In one transaction it locks them (FOR
// UPDATE SKIP LOCKED, so concurrent publishers take disjoint events),
// enqueues one queue_messages row per subscribed consumer (two with
// Duplicate), and sets published_at. A return of 0 means no unpublished event
// was free, not necessarily that none is left: another publisher may hold
// them.
func (p *Publisher) PublishBatch(ctx context.Context, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("outbox: publish: %w", errInvalidLimit)
	}
	var n int
	err := p.st.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `SELECT event_id FROM outbox_events
			WHERE published_at IS NULL
			ORDER BY created_at, event_id
			LIMIT $1
			FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		if len(p.consumers) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO queue_messages
					(consumer_name, message_id, event_type, tenant_id, payload, enqueued_at)
				SELECT s.consumer_name, e.event_id, e.event_type, e.tenant_id, e.payload, now()
				FROM outbox_events AS e
				JOIN unnest($2::TEXT[], $3::TEXT[]) AS s (consumer_name, event_type) ON s.event_type = e.event_type
				CROSS JOIN generate_series(1, $4::INT8) AS c (n)
				WHERE e.event_id = ANY ($1::TEXT[])`,
				ids, p.consumers, p.eventTypes, p.copies); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_events SET published_at = now() WHERE event_id = ANY ($1::TEXT[])`, ids); err != nil {
			return err
		}
		n = len(ids)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: publish: %w", err)
	}
	return n, nil
}

// Lag returns the age of the oldest unpublished event by the store's clock,
// or 0 when every event is published.
func (p *Publisher) Lag(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := p.st.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::FLOAT8
			FROM outbox_events WHERE published_at IS NULL`).Scan(&secs)
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: lag: %w", err)
	}
	if secs <= 0 { // none, or a writer's clock ahead of ours
		return 0, nil
	}
	return time.Duration(math.Round(secs * float64(time.Second))), nil
}

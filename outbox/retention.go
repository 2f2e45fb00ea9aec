package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/store"
)

// Pruned counts the rows one Prune deleted, by table.
type Pruned struct {
	Events     int `json:"events"`     // outbox_events, published
	Deliveries int `json:"deliveries"` // queue_messages, processed
	Inbox      int `json:"inbox"`      // consumer_inbox
	Emails     int `json:"emails"`     // email_notifications, sent
}

// Total is the number of rows deleted.
func (p Pruned) Total() int { return p.Events + p.Deliveries + p.Inbox + p.Emails }

// Full reports whether any table's batch came out at limit: rows may be
// left to prune.
func (p Pruned) Full(limit int) bool {
	return p.Events >= limit || p.Deliveries >= limit || p.Inbox >= limit || p.Emails >= limit
}

// Prune deletes, oldest first and up to limit rows per table, what the
// outbox no longer needs once it is older than age by the store's clock:
// events published, deliveries processed, receipts sent, and inbox rows no
// delivery can still ask for. Payments, ledger entries and the mail sink's
// sent_emails are business records and stay.
//
// An inbox row is what makes a second delivery of its message a duplicate,
// so it is kept while any delivery to its consumer is still pending that
// may carry its message: every delivery of a message is enqueued in the
// one transaction that publishes it, before any of them is processed, so
// an inbox row processed before the consumer's oldest pending delivery was
// enqueued has no delivery left. An event is published once, so nothing
// enqueues its message again.
//
// Each table's batch is a transaction of its own at READ COMMITTED, as the
// outbox's other work (see ExecTxReadCommitted).
func Prune(ctx context.Context, st *store.Store, age time.Duration, limit int) (Pruned, error) {
	var p Pruned
	if limit < 1 {
		return p, fmt.Errorf("outbox: prune: %w", errInvalidLimit)
	}
	if age <= 0 {
		return p, fmt.Errorf("outbox: prune: retention %v must be positive", age)
	}
	// $1::INT8: CockroachDB has INT, FLOAT and DECIMAL products with an
	// interval and cannot choose one for an untyped placeholder.
	ms := age.Milliseconds()
	for _, step := range []struct {
		n   *int
		sql string
	}{
		{&p.Events, `DELETE FROM outbox_events WHERE event_id IN (
			SELECT event_id FROM outbox_events
			WHERE published_at < now() - $1::INT8 * INTERVAL '1 millisecond'
			ORDER BY published_at LIMIT $2)`},
		{&p.Deliveries, `DELETE FROM queue_messages WHERE delivery_id IN (
			SELECT delivery_id FROM queue_messages
			WHERE processed_at < now() - $1::INT8 * INTERVAL '1 millisecond'
			ORDER BY processed_at LIMIT $2)`},
		{&p.Inbox, `DELETE FROM consumer_inbox WHERE (consumer_name, message_id) IN (
			SELECT i.consumer_name, i.message_id FROM consumer_inbox AS i
			WHERE i.processed_at < now() - $1::INT8 * INTERVAL '1 millisecond'
			  AND i.processed_at < COALESCE((SELECT min(q.enqueued_at) FROM queue_messages AS q
				WHERE q.consumer_name = i.consumer_name AND q.processed_at IS NULL), 'infinity')
			ORDER BY i.processed_at LIMIT $2)`},
		{&p.Emails, `DELETE FROM email_notifications WHERE dedupe_key IN (
			SELECT dedupe_key FROM email_notifications
			WHERE sent_at < now() - $1::INT8 * INTERVAL '1 millisecond'
			ORDER BY sent_at LIMIT $2)`},
	} {
		err := st.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, step.sql, ms, limit)
			*step.n = int(tag.RowsAffected())
			return err
		})
		if err != nil {
			return p, fmt.Errorf("outbox: prune: %w", err)
		}
	}
	return p, nil
}

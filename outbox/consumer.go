package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem/store"
)

// Inbox statuses (consumer_inbox.status).
const (
	// InboxProcessed marks a message whose handler's effect committed.
	InboxProcessed = "PROCESSED"
	// InboxRejected marks a message its handler refused for good (see
	// Reject); error_code says why.
	InboxRejected = "REJECTED"
)

// ErrUnknownConsumer is returned (wrapped) by ConsumeBatch for a consumer
// name with no handler.
var ErrUnknownConsumer = errors.New("unknown consumer")

// Message is one delivery of an outbox event to a consumer.
type Message struct {
	// DeliveryID identifies this delivery (queue_messages.delivery_id).
	DeliveryID string
	// Consumer is the consumer the message was delivered to.
	Consumer string
	// ID is the message id: the outbox event id. Several deliveries may
	// carry the same ID.
	ID string
	// Type is the event type, such as PaymentConfirmed.
	Type string
	// Tenant is the tenant the event belongs to.
	Tenant string
	// Payload is the event's JSON payload.
	Payload json.RawMessage
	// EnqueuedAt is when the publisher enqueued the delivery (store clock).
	EnqueuedAt time.Time
}

// Handler applies a message's durable effect through q, which is the
// consumer's transaction: the effect commits with the message's inbox row or
// not at all. A handler runs at most once per (consumer, message) to
// completion, but may run again after a failure or a retried transaction, so
// it must have no effect outside q. It returns Reject for a message it can
// never process; any other error leaves the message pending for a later
// batch.
type Handler func(ctx context.Context, q store.Querier, msg Message) error

// RejectError is a handler's verdict that a message can never be processed
// (a malformed payload, an event type it does not handle). The message is
// recorded in the inbox as REJECTED with Code, and its delivery is marked
// processed.
type RejectError struct {
	// Code is stored as consumer_inbox.error_code.
	Code string
	// Err is the reason, if any.
	Err error
}

// Reject returns a *RejectError with code and reason err (which may be nil).
func Reject(code string, err error) error { return &RejectError{Code: code, Err: err} }

// Error implements error.
func (e *RejectError) Error() string {
	if e.Err == nil {
		return "outbox: message rejected: " + e.Code
	}
	return fmt.Sprintf("outbox: message rejected: %s: %v", e.Code, e.Err)
}

// Unwrap returns the reason.
func (e *RejectError) Unwrap() error { return e.Err }

// HandlerError reports a handler failure for one delivery, whose message was
// left pending.
type HandlerError struct {
	// Consumer is the consumer whose handler failed.
	Consumer string
	// MessageID is the message (outbox event) id.
	MessageID string
	// DeliveryID is the delivery that stays pending.
	DeliveryID string
	// Err is the handler's error.
	Err error
}

// Error implements error.
func (e *HandlerError) Error() string {
	return fmt.Sprintf("outbox: consumer %s: message %s (delivery %s): %v", e.Consumer, e.MessageID, e.DeliveryID, e.Err)
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Stats counts what one ConsumeBatch committed.
type Stats struct {
	// Processed counts deliveries whose handler ran and whose effect
	// committed.
	Processed int
	// Duplicates counts deliveries of messages the consumer had already
	// processed (or rejected): they were only marked processed.
	Duplicates int
	// Rejected counts deliveries whose handler returned Reject.
	Rejected int
	// Failed counts deliveries whose handler failed; they stay pending.
	Failed int
}

// ConsumerOption configures Consumers.
type ConsumerOption func(*Consumers)

// WithHandler registers h as the handler of consumer name, replacing a
// built-in one of the same name.
func WithHandler(name string, h Handler) ConsumerOption {
	return func(c *Consumers) { c.handlers[name] = h }
}

// Consumers runs consumers' handlers over their queued deliveries. Any number
// of Consumers may run the same consumer at once, on any nodes. It is safe
// for concurrent use.
type Consumers struct {
	st       *store.Store
	handlers map[string]Handler
	// isolateAll runs every batch with a savepoint per delivery from the
	// start, the way a batch whose handler failed runs; only benchmarks
	// set it, to measure what the first attempt without savepoints saves.
	isolateAll bool
}

// NewConsumers returns the built-in consumers (ConsumerLedger with
// HandleLedger, ConsumerReceiptEmail with HandleReceiptEmail) plus those of
// opts.
func NewConsumers(st *store.Store, opts ...ConsumerOption) *Consumers {
	c := &Consumers{st: st, handlers: map[string]Handler{
		ConsumerLedger:       HandleLedger,
		ConsumerReceiptEmail: HandleReceiptEmail,
	}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ConsumeBatch processes up to limit of consumer's pending deliveries, oldest
// first, in one transaction (fewer round trips and commits than one per
// message; concurrent batches take disjoint rows through FOR UPDATE SKIP
// LOCKED). It claims the batch's (consumer, message) inbox rows in one
// statement: a message whose row already exists is a duplicate, whose
// delivery is only marked processed; for the others the handler runs in the
// same transaction and the delivery is marked processed, so each effect, its
// inbox row and the mark commit together.
//
// A handler that fails must leave no partial effect, so a failure is isolated
// under a savepoint. Savepoints cost two round trips per delivery, and
// handlers rarely fail, so a batch first runs without them; only when a
// handler fails is that attempt rolled back and the batch run again with a
// savepoint around each delivery. Then a failed delivery is rolled back to
// its savepoint (no inbox row, no partial effect, still pending) and the rest
// of the batch commits: ConsumeBatch returns the committed Stats together
// with an error joining one *HandlerError per failure. When a handler returns
// Reject, the message is recorded as REJECTED and its delivery processed. A
// serialization failure, a lost connection or a cancelled context aborts the
// whole batch (the store retries serialization failures); ConsumeBatch then
// returns zero Stats and the error.
func (c *Consumers) ConsumeBatch(ctx context.Context, consumer string, limit int) (Stats, error) {
	h, ok := c.handlers[consumer]
	if !ok {
		return Stats{}, fmt.Errorf("outbox: consume %q: %w", consumer, ErrUnknownConsumer)
	}
	if limit < 1 {
		return Stats{}, fmt.Errorf("outbox: consume %s: %w", consumer, errInvalidLimit)
	}
	stats, failures, err := c.consume(ctx, h, consumer, limit, c.isolateAll)
	if errors.Is(err, errIsolate) {
		stats, failures, err = c.consume(ctx, h, consumer, limit, true)
	}
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: consume %s: %w", consumer, err)
	}
	return stats, errors.Join(failures...)
}

// errIsolate aborts a batch run without savepoints in which a handler
// failed, for ConsumeBatch to run it again with them.
var errIsolate = errors.New("a handler failed: run the batch again with a savepoint per delivery")

// consume runs one batch transaction; isolate puts each delivery under a
// savepoint. Without isolate, a handler failure aborts the transaction with
// errIsolate.
func (c *Consumers) consume(ctx context.Context, h Handler, consumer string, limit int, isolate bool) (Stats, []error, error) {
	var (
		stats    Stats
		failures []error
	)
	err := c.st.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
		stats, failures = Stats{}, nil
		msgs, err := pendingDeliveries(ctx, tx, consumer, limit)
		if err != nil || len(msgs) == 0 {
			return err
		}
		var fresh map[string]bool
		if !isolate {
			if fresh, err = claimInbox(ctx, tx, consumer, msgs); err != nil {
				return err
			}
		}
		done := make([]string, 0, len(msgs))
		for _, m := range msgs {
			var res result
			if isolate {
				if res, err = deliver(ctx, tx, h, m); err != nil {
					return err
				}
			} else if !fresh[m.ID] {
				res.duplicate = true
			} else {
				delete(fresh, m.ID) // a second delivery in this batch is a duplicate
				if herr := h(ctx, tx, m); herr != nil {
					if abortsBatch(ctx, herr) {
						return herr
					}
					return errIsolate
				}
			}
			switch {
			case res.duplicate:
				stats.Duplicates++
			case res.rejected:
				stats.Rejected++
			case res.failure != nil:
				stats.Failed++
				failures = append(failures, &HandlerError{Consumer: consumer, MessageID: m.ID, DeliveryID: m.DeliveryID, Err: res.failure})
				continue // still pending
			default:
				stats.Processed++
			}
			done = append(done, m.DeliveryID)
		}
		if len(done) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE queue_messages SET processed_at = now() WHERE delivery_id = ANY ($1::UUID[])`, done)
		return err
	})
	return stats, failures, err
}

// claimInbox inserts the PROCESSED inbox rows of msgs' messages in one
// statement and returns the ids it inserted: those no earlier batch
// processed or rejected.
func claimInbox(ctx context.Context, tx pgx.Tx, consumer string, msgs []Message) (map[string]bool, error) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	rows, err := tx.Query(ctx, `INSERT INTO consumer_inbox (consumer_name, message_id, status, processed_at)
		SELECT $1, id, $3, now() FROM unnest($2::TEXT[]) AS id ORDER BY id
		ON CONFLICT (consumer_name, message_id) DO NOTHING
		RETURNING message_id`, consumer, ids, InboxProcessed)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	fresh := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}
	return fresh, nil
}

// pendingDeliveries locks up to limit of consumer's unprocessed deliveries
// that no concurrent batch holds.
func pendingDeliveries(ctx context.Context, tx pgx.Tx, consumer string, limit int) ([]Message, error) {
	rows, err := tx.Query(ctx, `SELECT delivery_id::TEXT, message_id, event_type, tenant_id, payload, enqueued_at
		FROM queue_messages
		WHERE consumer_name = $1 AND processed_at IS NULL
		ORDER BY enqueued_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED`, consumer, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Message, error) {
		m := Message{Consumer: consumer}
		var payload []byte
		err := row.Scan(&m.DeliveryID, &m.ID, &m.Type, &m.Tenant, &payload, &m.EnqueuedAt)
		m.Payload = payload
		return m, err
	})
}

// result is what became of one delivery.
type result struct {
	duplicate, rejected bool
	failure             error // the handler's error; the delivery stays pending
}

// deliver claims m's inbox row and runs h, under a savepoint of tx. A
// non-nil error aborts the batch.
func deliver(ctx context.Context, tx pgx.Tx, h Handler, m Message) (result, error) {
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		return result{}, err
	}
	tag, err := sp.Exec(ctx, `INSERT INTO consumer_inbox (consumer_name, message_id, status, processed_at)
		VALUES ($1, $2, $3, now()) ON CONFLICT (consumer_name, message_id) DO NOTHING`, m.Consumer, m.ID, InboxProcessed)
	if err != nil {
		return result{}, err // the transaction is rolled back as a whole
	}
	if tag.RowsAffected() == 0 {
		return result{duplicate: true}, sp.Commit(ctx) // RELEASE SAVEPOINT
	}
	herr := h(ctx, sp, m)
	if herr == nil {
		return result{}, sp.Commit(ctx)
	}
	if abortsBatch(ctx, herr) {
		return result{}, herr
	}
	if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
		return result{}, fmt.Errorf("roll back failed delivery %s: %w (handler: %w)", m.DeliveryID, err, herr)
	}
	var rej *RejectError
	if !errors.As(herr, &rej) {
		return result{failure: herr}, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO consumer_inbox (consumer_name, message_id, status, processed_at, error_code)
		VALUES ($1, $2, $3, now(), $4) ON CONFLICT (consumer_name, message_id) DO NOTHING`, m.Consumer, m.ID, InboxRejected, rej.Code); err != nil {
		return result{}, err
	}
	return result{rejected: true}, nil
}

// abortsBatch reports whether a handler's error must abort the whole batch
// rather than fail one delivery: the transaction can no longer commit (a
// serialization failure or deadlock, which the store retries), the
// connection is gone, or the caller gave up.
func abortsBatch(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		class := pgErr.Code[:min(2, len(pgErr.Code))]
		return class == "40" || class == "08" || class == "57" || class == "53"
	}
	var netErr net.Error
	return errors.As(err, &netErr) || pgconn.Timeout(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

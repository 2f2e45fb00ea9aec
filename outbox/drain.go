package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemcoord/idem/store"
)

// DrainConfig configures Drain.
type DrainConfig struct {
	// Guard is the effect guard of the region whose store is drained,
	// under that region's name (the guard its own nodes used): an effect
	// that region claimed and never produced is then produced by the
	// drain, and one another region claimed is not produced twice. Nil
	// when the cluster has no effects database.
	Guard *EffectGuard
	// Mailer sends the receipts. Default NewSinkMailer(st), as the nodes.
	Mailer Mailer
	// Batch bounds one publish, consume or send batch. Default 100.
	Batch int
}

// Backlog is the open work a store's outbox holds.
type Backlog struct {
	// Unpublished counts outbox events not yet moved to the queue.
	Unpublished int `json:"unpublished"`
	// Pending counts queued deliveries no consumer has processed.
	Pending int `json:"pending"`
	// Unsent counts receipt emails not sent and under no sender's claim.
	Unsent int `json:"unsent"`
	// Leased counts unsent emails under a sender's claim (SendLease): a
	// sender that died mid-send holds it until the lease runs out, and
	// only then may another send it (sending it earlier could send it
	// twice).
	Leased int `json:"leased"`
}

// Empty reports whether nothing is left but leased emails.
func (b Backlog) Empty() bool { return b.Unpublished+b.Pending+b.Unsent == 0 }

// DrainReport is what Drain did, and what it left.
type DrainReport struct {
	// Before is the backlog Drain found; Left what it left.
	Before Backlog `json:"before"`
	Left   Backlog `json:"left"`
	// Published counts events moved to the queue.
	Published int `json:"published"`
	// Consumed sums the consumers' batches.
	Consumed Stats `json:"consumed"`
	// Sent counts receipt emails the mailer accepted.
	Sent int `json:"sent"`
}

// Drain runs the outbox of st to its end on behalf of nodes that can no
// longer do it: a region lost for good, whose store still answers. It is
// what the region's own outbox worker does every interval (publish, then
// each built-in consumer, then the email sender), repeated until a pass
// makes no progress: every event published, every delivery processed
// (its effect claimed through cfg.Guard, as the region's nodes claimed
// it), every email sent but those under a sender's claim, which are left
// for after their lease (Backlog.Leased). It is safe beside the region's
// own nodes, should they return (every step takes its rows with FOR
// UPDATE SKIP LOCKED, consumers dedupe by message id, senders claim), and
// running it twice does nothing the second time. A delivery whose
// handler keeps failing stays pending (Left.Pending) and its error is
// returned with the report.
func Drain(ctx context.Context, st *store.Store, cfg DrainConfig) (DrainReport, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = 100
	}
	var rep DrainReport
	var err error
	if rep.Before, err = ReadBacklog(ctx, st); err != nil {
		return rep, err
	}
	pub := NewPublisher(st, PublisherConfig{})
	consumers := NewConsumers(st, WithEffectGuard(cfg.Guard))
	sender := NewSender(st, cfg.Mailer)
	var failures []error
	for {
		progress := 0
		for {
			n, err := pub.PublishBatch(ctx, cfg.Batch)
			if err != nil {
				return rep, fmt.Errorf("outbox: drain: %w", err)
			}
			rep.Published += n
			progress += n
			if n == 0 {
				break
			}
		}
		failures = failures[:0]
		for _, name := range []string{ConsumerLedger, ConsumerReceiptEmail} {
			for {
				s, err := consumers.ConsumeBatch(ctx, name, cfg.Batch)
				rep.Consumed = addStats(rep.Consumed, s)
				done := s.Processed + s.Duplicates + s.Rejected
				progress += done
				var herr *HandlerError
				if err != nil && !errors.As(err, &herr) {
					return rep, fmt.Errorf("outbox: drain: %w", err)
				}
				if err != nil {
					failures = append(failures, err)
				}
				if done == 0 {
					break
				}
			}
		}
		for {
			n, err := sender.SendBatch(ctx, cfg.Batch)
			rep.Sent += n
			progress += n
			if err != nil {
				failures = append(failures, err)
			}
			if n == 0 {
				break
			}
		}
		if progress == 0 || ctx.Err() != nil {
			break
		}
	}
	if rep.Left, err = ReadBacklog(ctx, st); err != nil {
		return rep, err
	}
	if len(failures) > 0 {
		return rep, fmt.Errorf("outbox: drain left work pending: %w", errors.Join(failures...))
	}
	return rep, ctx.Err()
}

// ReadBacklog counts the open work of st's outbox, by the store's clock.
func ReadBacklog(ctx context.Context, st *store.Store) (Backlog, error) {
	var b Backlog
	err := st.Read(ctx, func(q store.Querier) error {
		return q.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM outbox_events WHERE published_at IS NULL),
			(SELECT count(*) FROM queue_messages WHERE processed_at IS NULL),
			(SELECT count(*) FROM email_notifications WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until <= now())),
			(SELECT count(*) FROM email_notifications WHERE sent_at IS NULL AND claimed_until > now())`).
			Scan(&b.Unpublished, &b.Pending, &b.Unsent, &b.Leased)
	})
	if err != nil {
		return b, fmt.Errorf("outbox: backlog: %w", err)
	}
	return b, nil
}

func addStats(a, b Stats) Stats {
	return Stats{Processed: a.Processed + b.Processed, Duplicates: a.Duplicates + b.Duplicates,
		Rejected: a.Rejected + b.Rejected, Failed: a.Failed + b.Failed}
}

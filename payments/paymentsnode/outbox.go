package paymentsnode

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// Names of the outbox's workers (idempotency_worker_errors_total's worker
// label): the publisher, one per consumer, and the receipt sender, each a
// loop of its own so that none waits for another.
const (
	workerOutboxPublish = "outbox-publish"
	workerOutboxLedger  = "outbox-ledger"
	workerOutboxReceipt = "outbox-receipt-email"
	workerOutboxSend    = "outbox-send"
	workerOutboxPrune   = "outbox-prune"
)

var outboxWorkerNames = []string{workerOutboxPublish, workerOutboxLedger, workerOutboxReceipt, workerOutboxSend, workerOutboxPrune}

// pruneEvery is how often the outbox-prune worker runs for a retention:
// a tenth of it, between a second and ten seconds.
func pruneEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), 10*time.Second)
}

// pruneBatch bounds one Prune's rows per table: deletes through an index
// of the rows' age are cheap, and a pass must keep up with every event,
// delivery and inbox row the node's traffic makes (the one-hour soak's
// first run, at 100 rows per table and 50 batches a minute, kept up with
// the receipts and not with the rest).
const pruneBatch = 1000

// pruneBatches bounds the batches of one pass: at pruneBatch rows each, a
// backlog of a million rows per table is gone within a few passes.
const pruneBatches = 500

// drainBatches bounds the batches of one outbox pass.
const drainBatches = 50

// outboxWorkers are the leader-free outbox publisher, the ledger and
// receipt-email consumers and the email sender of one node, and their
// metrics.
type outboxWorkers struct {
	cfg       Outbox
	pay       *payments.Service
	pub       *outbox.Publisher
	consumers *outbox.Consumers
	sender    *outbox.Sender
	published prometheus.Counter
	consumed  *prometheus.CounterVec
	sent      prometheus.Counter
	pruned    *prometheus.CounterVec
	lag       prometheus.GaugeFunc
}

func newOutboxWorkers(pay *payments.Service, cfg Outbox) *outboxWorkers {
	if cfg.Batch <= 0 {
		cfg.Batch = 100
	}
	st := pay.Store()
	w := &outboxWorkers{
		cfg:       cfg,
		pay:       pay,
		pub:       outbox.NewPublisher(st, outbox.PublisherConfig{Duplicate: cfg.Duplicate}),
		consumers: outbox.NewConsumers(st, outbox.WithEffectGuard(cfg.EffectGuard)),
		sender:    outbox.NewSender(st, nil),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_published_total", Help: "Outbox events moved to the queue.",
		}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_consumed_total", Help: "Queue deliveries handled, by consumer and result (processed, duplicate, rejected, failed).",
		}, []string{"consumer", "result"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_emails_sent_total", Help: "Receipt emails handed to the mailer."}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_pruned_total", Help: "Outbox rows deleted past the retention, by table.",
		}, []string{"table"}),
	}
	for _, table := range []string{"outbox_events", "queue_messages", "consumer_inbox", "email_notifications"} {
		w.pruned.WithLabelValues(table)
	}
	w.lag = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outbox_lag_seconds", Help: "Age of the oldest unpublished outbox event, by the store's clock.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		lag, err := w.pub.Lag(ctx)
		if err != nil {
			return -1
		}
		return lag.Seconds()
	})
	for _, name := range []string{outbox.ConsumerLedger, outbox.ConsumerReceiptEmail} {
		for _, result := range []string{"processed", "duplicate", "rejected", "failed"} {
			w.consumed.WithLabelValues(name, result)
		}
	}
	return w
}

func (w *outboxWorkers) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.published, w.consumed, w.sent, w.pruned, w.lag}
}

// start starts the publisher, the consumers and the sender on s, each
// every cfg.Interval, and with a retention the pruner (pruneEvery); while a
// worker finds full batches it drains.
func (w *outboxWorkers) start(ctx context.Context, s *region.Server) {
	if w.cfg.Interval <= 0 {
		return
	}
	limit := w.cfg.Batch
	s.EveryUntraced(ctx, workerOutboxPublish, w.cfg.Interval, func(ctx context.Context) error {
		return drain(ctx, limit, func(ctx context.Context) (int, error) {
			n, err := w.pub.PublishBatch(ctx, limit)
			w.published.Add(float64(n))
			return n, err
		})
	})
	for worker, name := range map[string]string{workerOutboxLedger: outbox.ConsumerLedger, workerOutboxReceipt: outbox.ConsumerReceiptEmail} {
		s.EveryUntraced(ctx, worker, w.cfg.Interval, func(ctx context.Context) error {
			return drain(ctx, limit, func(ctx context.Context) (int, error) {
				st, err := w.consumers.ConsumeBatch(ctx, name, limit)
				w.consumed.WithLabelValues(name, "processed").Add(float64(st.Processed))
				w.consumed.WithLabelValues(name, "duplicate").Add(float64(st.Duplicates))
				w.consumed.WithLabelValues(name, "rejected").Add(float64(st.Rejected))
				w.consumed.WithLabelValues(name, "failed").Add(float64(st.Failed))
				return st.Processed + st.Duplicates + st.Rejected + st.Failed, err
			})
		})
	}
	s.EveryUntraced(ctx, workerOutboxSend, w.cfg.Interval, func(ctx context.Context) error {
		return drain(ctx, limit, func(ctx context.Context) (int, error) {
			n, err := w.sender.SendBatch(ctx, limit)
			w.sent.Add(float64(n))
			return n, err
		})
	})
	if w.cfg.Retention > 0 {
		st := w.pay.Store()
		s.EveryUntraced(ctx, workerOutboxPrune, pruneEvery(w.cfg.Retention), func(ctx context.Context) error {
			for range pruneBatches {
				p, err := outbox.Prune(ctx, st, w.cfg.Retention, pruneBatch)
				w.pruned.WithLabelValues("outbox_events").Add(float64(p.Events))
				w.pruned.WithLabelValues("queue_messages").Add(float64(p.Deliveries))
				w.pruned.WithLabelValues("consumer_inbox").Add(float64(p.Inbox))
				w.pruned.WithLabelValues("email_notifications").Add(float64(p.Emails))
				if err != nil || !p.Full(pruneBatch) || ctx.Err() != nil {
					return err
				}
			}
			return nil
		})
	}
}

// drain runs batch again while it does a full batch of limit (a backlog is
// left), up to drainBatches times, so that a worker keeps up with traffic
// above one batch per interval; it stops at the first error.
func drain(ctx context.Context, limit int, batch func(context.Context) (int, error)) error {
	for range drainBatches {
		n, err := batch(ctx)
		if err != nil || n < limit || ctx.Err() != nil {
			return err
		}
	}
	return nil
}

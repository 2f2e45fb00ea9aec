package region

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/outbox"
)

type outboxMetrics struct {
	published *prometheus.CounterVec
	consumed  *prometheus.CounterVec
	sent      prometheus.Counter
	lag       prometheus.GaugeFunc
}

// startOutbox starts the leader-free outbox publisher, the ledger and
// receipt-email consumers and the email sender, each a worker of its own
// that runs every OutboxInterval and, while it finds full batches, drains.
func (s *Server) startOutbox(ctx context.Context, cfg WorkerConfig) {
	if cfg.OutboxInterval <= 0 {
		return
	}
	pub := outbox.NewPublisher(s.store, outbox.PublisherConfig{Duplicate: cfg.DuplicateDelivery})
	consumers := outbox.NewConsumers(s.store, outbox.WithEffectGuard(cfg.EffectGuard))
	sender := outbox.NewSender(s.store, nil)
	m := &outboxMetrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_published_total", Help: "Outbox events moved to the queue.",
		}, nil),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_consumed_total", Help: "Queue deliveries handled, by consumer and result (processed, duplicate, rejected, failed).",
		}, []string{"consumer", "result"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_emails_sent_total", Help: "Receipt emails handed to the mailer."}),
		lag: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "outbox_lag_seconds", Help: "Age of the oldest unpublished outbox event, by the store's clock.",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			lag, err := pub.Lag(ctx)
			if err != nil {
				return -1
			}
			return lag.Seconds()
		}),
	}
	for _, c := range []prometheus.Collector{m.published, m.consumed, m.sent, m.lag} {
		if err := s.cfg.Registry.Register(c); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
			s.logger.Warn("outbox metrics not registered", "err", err)
		}
	}
	m.published.WithLabelValues()
	for _, name := range []string{outbox.ConsumerLedger, outbox.ConsumerReceiptEmail} {
		for _, result := range []string{"processed", "duplicate", "rejected", "failed"} {
			m.consumed.WithLabelValues(name, result)
		}
	}
	s.every(ctx, workerOutboxPublish, cfg.OutboxInterval, func(ctx context.Context) error {
		return drain(ctx, cfg.OutboxBatch, func(ctx context.Context) (int, error) {
			n, err := pub.PublishBatch(ctx, cfg.OutboxBatch)
			m.published.WithLabelValues().Add(float64(n))
			return n, err
		})
	})
	for worker, name := range map[string]string{workerOutboxLedger: outbox.ConsumerLedger, workerOutboxReceipt: outbox.ConsumerReceiptEmail} {
		s.every(ctx, worker, cfg.OutboxInterval, func(ctx context.Context) error {
			return drain(ctx, cfg.OutboxBatch, func(ctx context.Context) (int, error) {
				st, err := consumers.ConsumeBatch(ctx, name, cfg.OutboxBatch)
				m.consumed.WithLabelValues(name, "processed").Add(float64(st.Processed))
				m.consumed.WithLabelValues(name, "duplicate").Add(float64(st.Duplicates))
				m.consumed.WithLabelValues(name, "rejected").Add(float64(st.Rejected))
				m.consumed.WithLabelValues(name, "failed").Add(float64(st.Failed))
				return st.Processed + st.Duplicates + st.Rejected + st.Failed, err
			})
		})
	}
	s.every(ctx, workerOutboxSend, cfg.OutboxInterval, func(ctx context.Context) error {
		return drain(ctx, cfg.OutboxBatch, func(ctx context.Context) (int, error) {
			n, err := sender.SendBatch(ctx, cfg.OutboxBatch)
			m.sent.Add(float64(n))
			return n, err
		})
	})
}

// Names of the outbox's workers (idempotency_worker_errors_total's worker
// label): the publisher, one per consumer, and the receipt sender, each a
// loop of its own so that none waits for another.
const (
	workerOutboxPublish = "outbox-publish"
	workerOutboxLedger  = "outbox-ledger"
	workerOutboxReceipt = "outbox-receipt-email"
	workerOutboxSend    = "outbox-send"
)

// drainBatches bounds the batches of one outbox pass.
const drainBatches = 50

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

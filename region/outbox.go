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
// receipt-email consumers and the email sender, each every OutboxInterval.
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
	s.every(ctx, "outbox", cfg.OutboxInterval, func(ctx context.Context) error {
		n, err := pub.PublishBatch(ctx, cfg.OutboxBatch)
		m.published.WithLabelValues().Add(float64(n))
		if err != nil {
			return err
		}
		var errs []error
		for _, name := range []string{outbox.ConsumerLedger, outbox.ConsumerReceiptEmail} {
			st, err := consumers.ConsumeBatch(ctx, name, cfg.OutboxBatch)
			m.consumed.WithLabelValues(name, "processed").Add(float64(st.Processed))
			m.consumed.WithLabelValues(name, "duplicate").Add(float64(st.Duplicates))
			m.consumed.WithLabelValues(name, "rejected").Add(float64(st.Rejected))
			m.consumed.WithLabelValues(name, "failed").Add(float64(st.Failed))
			errs = append(errs, err)
		}
		sent, err := sender.SendBatch(ctx, cfg.OutboxBatch)
		m.sent.Add(float64(sent))
		return errors.Join(append(errs, err)...)
	})
}

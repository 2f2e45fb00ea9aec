package region

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/store"
)

// WorkerConfig configures a node's background workers. A zero interval
// disables that worker.
type WorkerConfig struct {
	// RecoveryInterval is how often the records of every operation
	// registered in the node's engine that nobody is working on (stale or
	// unknown) are recovered by its Recover. Suggested: 5s.
	RecoveryInterval time.Duration
	// RecoveryBatch bounds one recovery pass, per operation. Default
	// engine.DefaultRecoveryBatch (50).
	RecoveryBatch int
	// CleanupInterval is how often expired records are pruned and deleted.
	// Suggested: 1m.
	CleanupInterval time.Duration
	// Cleanup bounds what a cleanup pass does.
	Cleanup store.CleanupConfig
}

// workerNames label idempotency_worker_errors_total; an operation's own
// workers add theirs (Operation.WorkerNames).
var workerNames = []string{"recovery", "cleanup"}

type workerMetrics struct {
	recovery       *prometheus.CounterVec
	bodiesPruned   prometheus.Counter
	recordsDeleted prometheus.Counter
	workerErrors   *prometheus.CounterVec
}

func newWorkerMetrics(reg prometheus.Registerer, ops []Operation) (*workerMetrics, error) {
	m := &workerMetrics{
		recovery: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_recovery_total", Help: "Records handled by the recovery worker, by outcome (completed, failed, released, unknown, skipped; an operation may add its own).",
		}, []string{"outcome"}),
		bodiesPruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idempotency_cleanup_bodies_pruned_total", Help: "Response bodies dropped from records past their window.",
		}),
		recordsDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idempotency_cleanup_records_deleted_total", Help: "Expired record metadata deleted.",
		}),
		workerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_worker_errors_total", Help: "Failed background worker passes, by worker.",
		}, []string{"worker"}),
	}
	for _, c := range []prometheus.Collector{m.recovery, m.bodiesPruned, m.recordsDeleted, m.workerErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every series exists from the start, so that a rate reads 0.
	for _, outcome := range engine.RecoveryOutcomes {
		m.recovery.WithLabelValues(outcome)
	}
	for _, op := range ops {
		for _, outcome := range op.RecoveryOutcomes {
			m.recovery.WithLabelValues(outcome)
		}
	}
	for _, w := range workerNames {
		m.workerErrors.WithLabelValues(w)
	}
	for _, op := range ops {
		for _, w := range op.WorkerNames {
			m.workerErrors.WithLabelValues(w)
		}
	}
	return m, nil
}

// StartWorkers starts the node's background workers: recovery, cleanup and
// its operations' own (Operation.Workers). They stop when ctx is done or
// the server is closed; Close waits for them.
func (s *Server) StartWorkers(ctx context.Context, cfg WorkerConfig) {
	if cfg.RecoveryBatch <= 0 {
		cfg.RecoveryBatch = engine.DefaultRecoveryBatch
	}
	ctx, cancel := context.WithCancel(ctx)
	s.stopWorkers = cancel
	s.every(ctx, "recovery", cfg.RecoveryInterval, true, func(ctx context.Context) error {
		// Every operation registered in the node's engine, through the
		// engine, each by its own Recover.
		out, err := s.engine.RecoverStale(ctx, cfg.RecoveryBatch)
		for outcome, n := range out {
			s.workerMetrics.recovery.WithLabelValues(outcome).Add(float64(n))
		}
		for _, op := range s.ops {
			if op.Recovered != nil {
				op.Recovered(out)
			}
		}
		return err
	})
	s.every(ctx, "cleanup", cfg.CleanupInterval, true, func(ctx context.Context) error {
		res, err := s.store.Cleanup(ctx, cfg.Cleanup)
		s.workerMetrics.bodiesPruned.Add(float64(res.BodiesPruned))
		s.workerMetrics.recordsDeleted.Add(float64(res.RecordsDeleted))
		return err
	})
	for _, op := range s.ops {
		if op.Workers != nil {
			op.Workers(ctx, s, cfg)
		}
	}
}

// Every runs fn every interval among the node's background workers, until
// ctx is done or the server is closed (Close waits for it); a zero interval
// runs nothing. Failures are logged and counted under name
// (idempotency_worker_errors_total), never fatal. For an Operation's
// Workers.
func (s *Server) Every(ctx context.Context, name string, interval time.Duration, fn func(context.Context) error) {
	s.every(ctx, name, interval, true, fn)
}

// EveryUntraced is Every for a worker whose passes are too frequent to
// trace each (an outbox's, every few hundred milliseconds).
func (s *Server) EveryUntraced(ctx context.Context, name string, interval time.Duration, fn func(context.Context) error) {
	s.every(ctx, name, interval, false, fn)
}

// every runs fn every interval until ctx is done; failures are logged and
// counted, never fatal.
func (s *Server) every(ctx context.Context, name string, interval time.Duration, traced bool, fn func(context.Context) error) {
	if interval <= 0 {
		return
	}
	s.workers.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pass := fn
			if traced {
				pass = func(ctx context.Context) error { return s.tracedPass(ctx, name, fn) }
			}
			if err := pass(ctx); err != nil && ctx.Err() == nil {
				s.workerMetrics.workerErrors.WithLabelValues(name).Inc()
				s.logger.WarnContext(ctx, "background worker failed", "worker", name, "err", err)
			}
		}
	})
}

// workerGroup is embedded in Server.
type workerGroup = sync.WaitGroup

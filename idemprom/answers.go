package idemprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/engine/answers"
)

// AnswerCache counts what the engine's answer cache does
// (engine.AnswerCache.Metrics): idem_answer_cache_hits_total,
// idem_answer_cache_misses_total, idem_answer_cache_evictions_total{reason}
// (reason "size": dropped, least recently used first, to stay within the
// cache's bytes; "expired": found past its record's window or the
// retention), and the gauges idem_answer_cache_entries and
// idem_answer_cache_bytes.
type AnswerCache struct {
	hits, misses  prometheus.Counter
	evicted       map[string]prometheus.Counter
	entries, held prometheus.Gauge
}

var _ answers.Metrics = (*AnswerCache)(nil)

// NewAnswerCache registers the answer cache's metrics with reg and returns
// them. A metric reg has already (from another NewAnswerCache on the same
// registry) is shared, not an error: counts of several engines add up,
// and the gauges show the last one to change.
func NewAnswerCache(reg prometheus.Registerer) (*AnswerCache, error) {
	m := &AnswerCache{evicted: map[string]prometheus.Counter{}}
	var err error
	if m.hits, err = registerOne(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_answer_cache_hits_total", Help: "Requests the answer cache decided from memory (a replay, or a key reused with another command refused).",
	})); err != nil {
		return nil, err
	}
	if m.misses, err = registerOne(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_answer_cache_misses_total", Help: "Requests the answer cache held no live answer for (they went to the store).",
	})); err != nil {
		return nil, err
	}
	evicted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_answer_cache_evictions_total", Help: "Answers that left the answer cache, by reason: size (to stay within its bytes) or expired (past their record's window or the retention).",
	}, []string{"reason"})
	if evicted, err = registerOne(reg, evicted); err != nil {
		return nil, err
	}
	for _, r := range []string{answers.EvictedSize, answers.EvictedExpired} {
		m.evicted[r] = evicted.WithLabelValues(r)
	}
	if m.entries, err = registerOne(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idem_answer_cache_entries", Help: "Answers the answer cache holds.",
	})); err != nil {
		return nil, err
	}
	if m.held, err = registerOne(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idem_answer_cache_bytes", Help: "Bytes the answer cache's entries hold, as counted against its bound.",
	})); err != nil {
		return nil, err
	}
	return m, nil
}

// registerOne registers c with reg, or returns the collector of the same
// description reg already has.
func registerOne[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("idemprom: register metrics: %w", err)
}

// Lookup implements answers.Metrics.
func (m *AnswerCache) Lookup(hit bool) {
	if hit {
		m.hits.Inc()
		return
	}
	m.misses.Inc()
}

// Evicted implements answers.Metrics.
func (m *AnswerCache) Evicted(reason string) {
	if c, ok := m.evicted[reason]; ok {
		c.Inc()
	}
}

// Held implements answers.Metrics.
func (m *AnswerCache) Held(entries int, bytes int64) {
	m.entries.Set(float64(entries))
	m.held.Set(float64(bytes))
}

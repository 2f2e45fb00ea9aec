package collectors

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolCollector exposes a pgx pool's statistics (pool.Stat) as
// idem_pgxpool_* metrics, read at every scrape.
type PoolCollector struct {
	pool *pgxpool.Pool
	descs
}

type descs struct {
	acquired, idle, total, max, constructing    *prometheus.Desc
	acquires, emptyAcquires, canceled, waitSecs *prometheus.Desc
}

// NewPoolCollector returns a collector of pool's statistics.
func NewPoolCollector(pool *pgxpool.Pool) *PoolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("idem_pgxpool_"+name, help, nil, nil)
	}
	return &PoolCollector{pool: pool, descs: descs{
		acquired:      d("acquired_conns", "Connections of the store's pool currently checked out."),
		idle:          d("idle_conns", "Idle connections in the store's pool."),
		total:         d("total_conns", "Connections in the store's pool (acquired, idle and being opened)."),
		max:           d("max_conns", "Largest size the store's pool may grow to."),
		constructing:  d("constructing_conns", "Connections of the store's pool being opened."),
		acquires:      d("acquire_total", "Connections acquired from the store's pool."),
		emptyAcquires: d("empty_acquire_total", "Acquires that found no idle connection and had to wait or open one."),
		canceled:      d("canceled_acquire_total", "Acquires abandoned because their context ended (a request gave up waiting for a connection)."),
		waitSecs:      d("acquire_wait_seconds_total", "Total time spent acquiring connections from the store's pool."),
	}}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.constructing,
		c.acquires, c.emptyAcquires, c.canceled, c.waitSecs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(c.acquired, float64(s.AcquiredConns()))
	g(c.idle, float64(s.IdleConns()))
	g(c.total, float64(s.TotalConns()))
	g(c.max, float64(s.MaxConns()))
	g(c.constructing, float64(s.ConstructingConns()))
	n(c.acquires, float64(s.AcquireCount()))
	n(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	n(c.canceled, float64(s.CanceledAcquireCount()))
	n(c.waitSecs, s.AcquireDuration().Seconds())
}

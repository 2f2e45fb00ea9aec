package region

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/store"
)

// metrics are the node's Prometheus metrics, registered on an injected
// registerer (several nodes may run in one process).
type metrics struct {
	requests       *prometheus.CounterVec
	replays        *prometheus.CounterVec
	conflicts      *prometheus.CounterVec
	inProgress     *prometheus.CounterVec
	expiredRetries *prometheus.CounterVec
	unknownStates  *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	httpDuration   *prometheus.HistogramVec
	forwarded      *prometheus.CounterVec
	fenced         prometheus.Counter
	// takenShare is the store's share of recent claims that found their key
	// taken (store.Store.TakenShare).
	takenShare        prometheus.GaugeFunc
	inProgressAgeDesc *prometheus.Desc
	// groupWritesDesc and groupBatchesDesc are the store's group commits'
	// counts (store.Store.GroupStats).
	groupWritesDesc, groupBatchesDesc *prometheus.Desc
	store                             *store.Store
}

// requestOutcomes are every outcome label of the keyed-request metrics
// (idem.OutcomeLabels): a request refused before a decision (a bad body, an
// unavailable store) is idem.LabelRejected.
var requestOutcomes = idem.OutcomeLabels()

// refusedLabel is the outcome label of a request answered with err before
// a decision: idem.LabelError when the node could not decide (its store
// unavailable, an internal error), else idem.LabelRejected (the request
// itself was refused).
func refusedLabel(err error) string {
	switch idem.ErrorCode(err) {
	case idem.ECodeStoreUnavailable, idem.ECodeUnavailable, idem.ECodeInternal:
		return idem.LabelError
	}
	return idem.LabelRejected
}

// outcomeLabel returns o's label, or "rejected" for a request that reached no
// decision: every label value comes from requestOutcomes.
func outcomeLabel(o idem.Outcome) string {
	if s := o.String(); slices.Contains(requestOutcomes, s) {
		return s
	}
	return idem.LabelRejected
}

// newMetrics registers the node's metrics on reg. Every labelled series of
// the operations the node serves (operations) exists from the start at 0, so
// that a rate over it reads 0 rather than "no data"; label values only ever
// come from operations, the fixed outcome list and the mux's route patterns,
// never from a request.
func newMetrics(reg prometheus.Registerer, st *store.Store, operations []string) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_requests_total", Help: "Requests with an idempotency key, by operation and outcome.",
		}, []string{"operation", "outcome"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_replay_total", Help: "Stored responses replayed.",
		}, []string{"operation"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_conflict_different_request_total", Help: "Keys reused with a different normalised command (rejected with 409).",
		}, []string{"operation"}),
		inProgress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_in_progress_answers_total", Help: "Requests answered 409 IN_PROGRESS because another owner held the key.",
		}, []string{"operation"}),
		expiredRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_expired_retry_total", Help: "Retries that arrived after the key's replay window and became new operations.",
		}, []string{"operation"}),
		unknownStates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_unknown_state_total", Help: "Operations that entered UNKNOWN_REQUIRES_RECOVERY.",
		}, []string{"operation"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idempotency_request_duration_seconds", Help: "Latency of idempotent requests, by operation and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"operation", "outcome"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "http_request_duration_seconds", Help: "HTTP request latency, by route and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route", "code"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_forwarded_total", Help: "Requests forwarded to the tenant's home region, by home region.",
		}, []string{"home_region"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idempotency_fenced_total", Help: "Writes or provider calls of this node rejected because a newer owner held the record.",
		}),
		takenShare: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idempotency_claim_taken_share",
			Help: "Share of the store's recent claims (Begin's) that found their key taken; above 0.1 a claim reads the record that took it in its own statement.",
		}, st.TakenShare),
		inProgressAgeDesc: prometheus.NewDesc("idempotency_in_progress_age_max_seconds",
			"Age of the oldest record in IN_PROGRESS, by the store's clock (0 when none).", nil, nil),
		groupWritesDesc: prometheus.NewDesc("idempotency_store_group_writes_total",
			"Writes of the store's group commits, by kind (claim, operation_claim, checkpoint, completion) and statement: own (a statement of their own) or batch (a batch of two or more).",
			[]string{"kind", "statement"}, nil),
		groupBatchesDesc: prometheus.NewDesc("idempotency_store_group_batches_total",
			"Batches of two or more writes the store's group commits sent, by kind.", []string{"kind"}, nil),
		store: st,
	}
	for _, c := range []prometheus.Collector{m.requests, m.replays, m.conflicts, m.inProgress, m.expiredRetries,
		m.unknownStates, m.latency, m.httpDuration, m.forwarded, m.fenced, m.takenShare, m} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, op := range operations {
		for _, outcome := range requestOutcomes {
			m.requests.WithLabelValues(op, outcome)
		}
		for _, c := range []*prometheus.CounterVec{m.replays, m.conflicts, m.inProgress, m.expiredRetries, m.unknownStates} {
			c.WithLabelValues(op)
		}
	}
	return m, nil
}

// Describe implements prometheus.Collector for the store-derived metrics.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.inProgressAgeDesc
	ch <- m.groupWritesDesc
	ch <- m.groupBatchesDesc
}

// Collect implements prometheus.Collector: the store's group commit counts,
// and the age of the oldest in-progress record, asked of the store with a
// short timeout.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, g := range m.store.GroupStats() {
		ch <- prometheus.MustNewConstMetric(m.groupWritesDesc, prometheus.CounterValue, float64(g.Own), g.Kind, "own")
		ch <- prometheus.MustNewConstMetric(m.groupWritesDesc, prometheus.CounterValue, float64(g.Batched), g.Kind, "batch")
		ch <- prometheus.MustNewConstMetric(m.groupBatchesDesc, prometheus.CounterValue, float64(g.Batches), g.Kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	age, err := store.InProgressAgeMax(ctx, m.store.Pool())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.inProgressAgeDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(m.inProgressAgeDesc, prometheus.GaugeValue, age.Seconds())
}

// Observation is what an operation's idempotent request counts in the
// node's metrics (idempotency_requests_total and the series beside it).
type Observation struct {
	// Outcome is the engine's decision (zero when the request was refused
	// before one).
	Outcome idem.Outcome
	// Replayed, ExpiredRetry and Unknown: the answer was a replay, came
	// from a key retried after its window, or left the outcome unknown.
	Replayed, ExpiredRetry, Unknown bool
}

// Observe counts an idempotent request of operation (one of the node's
// Operations): its outcome, or the error it was refused with, and its
// duration d. For an Operation's handlers behind their own middleware.
func (s *Server) Observe(operation string, o Observation, err error, d time.Duration) {
	outcome := outcomeLabel(o.Outcome)
	switch idem.ErrorCode(err) {
	case "":
	case idem.ECodeKeyReused:
		outcome = idem.OutcomeConflict.String()
		s.metrics.conflicts.WithLabelValues(operation).Inc()
	case idem.ECodeInProgress:
		outcome = idem.OutcomeInProgress.String()
		s.metrics.inProgress.WithLabelValues(operation).Inc()
	default:
		if o.Outcome == 0 {
			outcome = refusedLabel(err)
		}
	}
	if o.Replayed {
		s.metrics.replays.WithLabelValues(operation).Inc()
	}
	if o.ExpiredRetry {
		s.metrics.expiredRetries.WithLabelValues(operation).Inc()
	}
	if o.Unknown {
		s.metrics.unknownStates.WithLabelValues(operation).Inc()
	}
	s.metrics.requests.WithLabelValues(operation, outcome).Inc()
	s.metrics.latency.WithLabelValues(operation, outcome).Observe(d.Seconds())
}

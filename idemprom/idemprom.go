// Package idemprom counts what idemhttp's middleware and the sidecar do with
// Prometheus counters: it implements idemhttp.Metrics and sidecar.Metrics.
//
//	m, err := idemprom.New(reg) // reg: the program's prometheus.Registerer
//	mw, err := idemhttp.Middleware(eng, idemhttp.Options{..., Metrics: m})
//
// It is a package of its own so that idemhttp and sidecar import no metrics
// library: client_golang's prometheus package imports expvar, whose init
// registers GET /debug/vars on http.DefaultServeMux of every program that
// links it. A program that imports idemprom has chosen Prometheus, and with
// it that handler (which serves nothing unless the program serves
// http.DefaultServeMux).
package idemprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/sidecar"
)

// Metrics holds the counters idemhttp_requests_total{operation,outcome},
// idem_sidecar_upstream_calls_total{operation,call,result} and
// idem_sidecar_webhook_rejected_total{operation,reason}. One value serves
// any number of middlewares and proxies.
type Metrics struct {
	requests *prometheus.CounterVec
	calls    *prometheus.CounterVec
	rejected *prometheus.CounterVec
}

var (
	_ idemhttp.Metrics       = (*Metrics)(nil)
	_ sidecar.Metrics        = (*Metrics)(nil)
	_ sidecar.WebhookMetrics = (*Metrics)(nil)
)

// New registers the counters with reg and returns them. A counter reg has
// already (from another New on the same registry) is shared, not an error.
func New(reg prometheus.Registerer) (*Metrics, error) {
	requests, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemhttp_requests_total",
		Help: "Requests through the idempotency middleware, by operation and outcome.",
	}, []string{"operation", "outcome"}))
	if err != nil {
		return nil, err
	}
	calls, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_sidecar_upstream_calls_total",
		Help: "Calls of sidecar upstreams, by operation, kind (execute, lookup, resend) and result; result=\"unknown\" is an outcome an operator may have to settle.",
	}, []string{"operation", "call", "result"}))
	if err != nil {
		return nil, err
	}
	rejected, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_sidecar_webhook_rejected_total",
		Help: "Deliveries refused by sidecar webhook routes with 401 WEBHOOK_SIGNATURE_INVALID, by operation and reason (unsigned, malformed, mismatch, stale).",
	}, []string{"operation", "reason"}))
	if err != nil {
		return nil, err
	}
	return &Metrics{requests: requests, calls: calls, rejected: rejected}, nil
}

func register(reg prometheus.Registerer, cv *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	err := reg.Register(cv)
	if err == nil {
		return cv, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return nil, fmt.Errorf("idemprom: register metrics: %w", err)
}

// Requests implements idemhttp.Metrics: it creates operation's series for
// every outcome, at 0.
func (m *Metrics) Requests(operation string) func(outcome string) {
	byOutcome := make(map[string]prometheus.Counter)
	for _, o := range idemhttp.Outcomes() {
		byOutcome[o] = m.requests.WithLabelValues(operation, o)
	}
	return func(outcome string) {
		if c, ok := byOutcome[outcome]; ok {
			c.Inc()
			return
		}
		m.requests.WithLabelValues(operation, outcome).Inc()
	}
}

// UpstreamCalls implements sidecar.Metrics: it creates operation's series
// for every call kind and result, at 0.
func (m *Metrics) UpstreamCalls(operation string) func(call, result string) {
	type key struct{ call, result string }
	byKey := make(map[key]prometheus.Counter)
	for _, k := range sidecar.CallKinds() {
		for _, r := range sidecar.CallResults() {
			byKey[key{k, r}] = m.calls.WithLabelValues(operation, k, r)
		}
	}
	return func(call, result string) {
		if c, ok := byKey[key{call, result}]; ok {
			c.Inc()
			return
		}
		m.calls.WithLabelValues(operation, call, result).Inc()
	}
}

// WebhookRejections implements sidecar.WebhookMetrics: it creates
// operation's series for every reason, at 0. A reason outside
// sidecar.WebhookRejectReasons() is not counted.
func (m *Metrics) WebhookRejections(operation string) func(reason string) {
	byReason := make(map[string]prometheus.Counter)
	for _, r := range sidecar.WebhookRejectReasons() {
		byReason[r] = m.rejected.WithLabelValues(operation, r)
	}
	return func(reason string) {
		if c, ok := byReason[reason]; ok {
			c.Inc()
		}
	}
}

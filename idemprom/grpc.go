package idemprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
)

// GRPCMetrics holds the counter idemgrpc_requests_total{operation,outcome}:
// it implements idemgrpc.Metrics (without importing it, so that a program
// that counts only HTTP links no gRPC). One value serves any number of
// interceptors.
type GRPCMetrics struct {
	requests *prometheus.CounterVec
}

// NewGRPC registers the counter with reg and returns it. A counter reg has
// already (from another NewGRPC on the same registry) is shared, not an
// error.
func NewGRPC(reg prometheus.Registerer) (*GRPCMetrics, error) {
	requests, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemgrpc_requests_total",
		Help: "Calls through the idempotency gRPC interceptor, by operation and outcome.",
	}, []string{"operation", "outcome"}))
	if err != nil {
		return nil, err
	}
	return &GRPCMetrics{requests: requests}, nil
}

// Requests implements idemgrpc.Metrics: it creates operation's series for
// every outcome (idem.OutcomeLabels()), at 0.
// An outcome outside them is not counted.
func (m *GRPCMetrics) Requests(operation string) func(outcome string) {
	byOutcome := make(map[string]prometheus.Counter)
	for _, o := range idem.OutcomeLabels() {
		byOutcome[o] = m.requests.WithLabelValues(operation, o)
	}
	return func(outcome string) {
		if c, ok := byOutcome[outcome]; ok {
			c.Inc()
		}
	}
}

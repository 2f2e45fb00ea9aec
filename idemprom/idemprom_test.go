package idemprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/sidecar"
)

// TestSeriesExistBeforeTheFirstCount: an operation's series are created at
// 0 when the middleware or proxy asks for its counter, and each count lands
// on its own labels.
func TestSeriesExistBeforeTheFirstCount(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	requests := m.Requests("create_transfer")
	calls := m.UpstreamCalls("create_transfer")
	rejected := m.WebhookRejections("receive_event")
	want := len(idemhttp.Outcomes()) + len(sidecar.CallKinds())*len(sidecar.CallResults()) + len(sidecar.WebhookRejectReasons())
	if n, err := testutil.GatherAndCount(reg); err != nil || n != want {
		t.Fatalf("series before any count = %d, %v; want %d", n, err, want)
	}
	requests("replay")
	requests("replay")
	calls("lookup", "unknown")
	rejected("stale")
	rejected("not a reason")     // not counted, no series
	m2, err := idemprom.New(reg) // the same registry: shares the counters
	if err != nil {
		t.Fatalf("second New on the same registry: %v", err)
	}
	m2.Requests("create_transfer")("execute")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != want {
		t.Errorf("series after counting = %d, %v; want %d", n, err, want)
	}
	for _, c := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"idemhttp_requests_total", map[string]string{"operation": "create_transfer", "outcome": "replay"}, 2},
		{"idemhttp_requests_total", map[string]string{"operation": "create_transfer", "outcome": "execute"}, 1},
		{"idemhttp_requests_total", map[string]string{"operation": "create_transfer", "outcome": "conflict"}, 0},
		{"idem_sidecar_upstream_calls_total", map[string]string{"operation": "create_transfer", "call": "lookup", "result": "unknown"}, 1},
		{"idem_sidecar_upstream_calls_total", map[string]string{"operation": "create_transfer", "call": "execute", "result": "completed"}, 0},
		{"idem_sidecar_webhook_rejected_total", map[string]string{"operation": "receive_event", "reason": "stale"}, 1},
		{"idem_sidecar_webhook_rejected_total", map[string]string{"operation": "receive_event", "reason": "mismatch"}, 0},
	} {
		if got := value(t, reg, c.metric, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.metric, c.labels, got, c.want)
		}
	}
}

// TestNewRefusesAClashingMetric: a registry holding another metric of the
// same name is an error, not a silent second counter.
func TestNewRefusesAClashingMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemhttp_requests_total", Help: "not a counter"}))
	if _, err := idemprom.New(reg); err == nil {
		t.Fatal("New with a clashing metric registered: no error")
	}
}

func value(t *testing.T, reg *prometheus.Registry, metric string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetValue() != labels[lp.GetName()] {
					continue series
				}
			}
			return s.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s%v: no such series", metric, labels)
	return 0
}

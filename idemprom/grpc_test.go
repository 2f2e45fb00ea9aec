package idemprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemprom"
)

// TestGRPCSeries: the interceptor's series exist at 0 before the first
// call, a second NewGRPC on the same registry shares them, and an outcome
// outside idem.OutcomeLabels() makes no series.
func TestGRPCSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := idemprom.NewGRPC(reg)
	if err != nil {
		t.Fatal(err)
	}
	count := m.Requests("create_transfer")
	want := len(idem.OutcomeLabels())
	if n, err := testutil.GatherAndCount(reg, "idemgrpc_requests_total"); err != nil || n != want {
		t.Fatalf("series before any count = %d, %v; want %d", n, err, want)
	}
	count(idem.LabelRejected)
	count("not an outcome")
	m2, err := idemprom.NewGRPC(reg)
	if err != nil {
		t.Fatalf("second NewGRPC on the same registry: %v", err)
	}
	m2.Requests("create_transfer")(idem.LabelRejected)
	if n, err := testutil.GatherAndCount(reg, "idemgrpc_requests_total"); err != nil || n != want {
		t.Errorf("series after counting = %d, %v; want %d", n, err, want)
	}
	if got := value(t, reg, "idemgrpc_requests_total", map[string]string{"operation": "create_transfer", "outcome": idem.LabelRejected}); got != 2 {
		t.Errorf("rejected = %v, want 2", got)
	}
}

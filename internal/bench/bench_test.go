package bench_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/bench"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

// TestRunCountsWhatItWrote: the report's counts match the rows in the store,
// so the figures in docs/benchmarks.md describe real writes.
func TestRunCountsWhatItWrote(t *testing.T) {
	st, _ := storetest.New(t)
	rep, err := bench.Run(context.Background(), st, bench.Config{Concurrency: 2, PhaseDuration: 300 * time.Millisecond, Rounds: 1, ReplayKeys: 20})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Baseline.Ops == 0 || rep.Idempotent.Ops == 0 || rep.Replay.Ops == 0 {
		t.Fatalf("empty phases: %+v", rep)
	}
	if rep.Baseline.Errors+rep.Idempotent.Errors+rep.Replay.Errors != 0 {
		t.Errorf("errors in report: %+v", rep)
	}
	pays := storetest.Count(t, st, `SELECT count(*) FROM payments`)
	if want := rep.Baseline.Ops + rep.Idempotent.Ops + 20; pays != want {
		t.Errorf("payments = %d, want baseline %d + idempotent %d + 20 replay seeds", pays, rep.Baseline.Ops, rep.Idempotent.Ops)
	}
	records := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records`)
	if want := rep.Idempotent.Ops + 20; records != want {
		t.Errorf("records = %d, want %d", records, want)
	}
	if rep.Ratio <= 0 || !strings.Contains(rep.Markdown(), "ratio idempotent/baseline") {
		t.Errorf("ratio %v, markdown:\n%s", rep.Ratio, rep.Markdown())
	}
}

package chaos

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPgBouncerScenario runs pgbouncer-restart briefly: the nodes' store
// behind PgBouncer, killed and restarted four times mid-traffic, twice
// with commits held at the server; every check passes, each kill was
// injected and healed, and the kills mid-commit found commits in flight.
func TestPgBouncerScenario(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		if _, err := exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			t.Skip(`pgbouncer is not installed (Debian package "pgbouncer")`)
		}
	}
	opts := runOpts(t, "pgbouncer-restart", "")
	opts.Duration = 12 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("pgbouncer-restart failed: %s", rep.FailedChecks())
	}
	if len(rep.Scenarios) != 1 || !rep.Scenarios[0].PgBouncer {
		t.Fatalf("%d scenario reports, want 1 that ran behind PgBouncer", len(rep.Scenarios))
	}
	s := rep.Scenarios[0]
	if len(s.Faults) != 4 {
		t.Fatalf("%d faults, want 4: %+v", len(s.Faults), s.Faults)
	}
	for _, f := range s.Faults {
		restarted, held := false, !strings.Contains(f.Name, "commits held")
		for _, n := range f.Notes {
			restarted = restarted || strings.HasPrefix(n, "restarted as pid ")
			held = held || (strings.HasSuffix(n, " commits held at the server when PgBouncer was killed") && !strings.HasPrefix(n, "0 "))
		}
		if !strings.HasPrefix(f.Name, "kill-pgbouncer") || f.Skipped != "" || f.InjectError != "" || f.HealError != "" || f.PostHealthError != "" || !restarted || !held {
			t.Errorf("fault %+v: want it injected (mid-commit: with commits held), healed (restarted) and healthy after", f)
		}
	}
}

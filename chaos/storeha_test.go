package chaos

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStoreScenarios runs the replicated store's scenarios briefly: the
// primary's region dies, then the primary is cut off; every check passes,
// and each fault notes the store's recovery time.
func TestStoreScenarios(t *testing.T) {
	if _, err := exec.LookPath("patroni"); err != nil {
		t.Skip(`patroni is not installed (Debian package "patroni")`)
	}
	opts := runOpts(t, "store-primary-loss,store-partition", "")
	opts.Duration = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("store scenarios failed: %s", rep.FailedChecks())
	}
	if len(rep.Scenarios) != 2 {
		t.Fatalf("%d scenario reports, want 2", len(rep.Scenarios))
	}
	for _, s := range rep.Scenarios {
		if len(s.Faults) != 1 {
			t.Errorf("%s: %d faults, want 1", s.Name, len(s.Faults))
			continue
		}
		f := s.Faults[0]
		recovery := false
		for _, n := range f.Notes {
			recovery = recovery || strings.HasPrefix(n, "store recovery: ")
		}
		if f.Skipped != "" || f.InjectError != "" || f.HealError != "" || !recovery {
			t.Errorf("%s: fault %+v, want it injected and healed, its notes giving the store's recovery time", s.Name, f)
		}
	}
}

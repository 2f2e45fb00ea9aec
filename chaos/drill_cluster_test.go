package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/cluster"
)

// TestDrillAgainstRunningCluster runs RunDrill against a cluster started
// beforehand (as idemctl up starts one), with the operator's commands
// stopping and resuming the region's node processes: the drill performs
// the failover, hands the records over, passes every check and reports
// the drill figures of the region's tenants.
//
// It does not run in parallel with the scenario tests: their runs must
// reach a minimum rate on a shared machine.
func TestDrillAgainstRunningCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: []string{"eu-west", "us-east"}, NodesPerRegion: 1, IdemdPath: idemdPath,
		EtcdMembers: 1, EtcdPath: etcdPath, Provider: true, IdemctlPath: idemctlPath,
		RegionLeaseTTL: 3 * time.Second, Tenants: []string{"tenant-a", "tenant-b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	info := c.Info()
	var pids []string
	for _, r := range info.Regions {
		if r.Name == "eu-west" {
			for _, p := range r.Pids {
				pids = append(pids, fmt.Sprint(p))
			}
		}
	}
	if len(pids) == 0 || info.Placements["tenant-a"] != "eu-west" {
		t.Fatalf("cluster.json names no eu-west pid (%v) or tenant-a is not homed there (%v)", pids, info.Placements)
	}
	rep, err := RunDrill(ctx, DrillOptions{
		Cluster: info, Region: "eu-west", Failover: FailoverManual,
		Inject: "kill -STOP " + strings.Join(pids, " "), Heal: "kill -CONT " + strings.Join(pids, " "),
		LeaseTTL: 3 * time.Second, Duration: 12 * time.Second, Seed: 3, Clients: 4, StuckBound: 20 * time.Second,
		OutDir: t.TempDir(),
	})
	if err != nil {
		t.Fatalf("drill: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("drill failed: %s", rep.FailedChecks())
	}
	s := rep.Scenarios[0]
	d := s.Drill
	if d == nil || len(d.Tenants) != 1 || d.Tenants[0].Tenant != "tenant-a" || d.Failover != FailoverManual {
		t.Fatalf("drill = %+v, want tenant-a's figures of a manual failover", d)
	}
	if d.RTOMaxSeconds <= 0 || d.RTOMaxSeconds > d.RTOBoundSeconds || !d.Passed {
		t.Errorf("RTO %.2fs (bound %.1fs), passed %v", d.RTOMaxSeconds, d.RTOBoundSeconds, d.Passed)
	}
	notes := strings.Join(s.Faults[0].Notes, "\n")
	for _, want := range []string{"moved eu-west's tenants to us-east", "answer /readyz again", "handover tenant-a"} {
		if !strings.Contains(notes, want) {
			t.Errorf("fault notes lack %q:\n%s", want, notes)
		}
	}
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/testbin"
)

// The binaries built by TestMain; set once before the tests run and only
// read by them.
var (
	idemdPath   string
	idemctlPath string
	etcdPath    string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "chaos-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins, err := testbin.BuildAll(dir, testbin.FailpointsTag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	idemdPath, idemctlPath, etcdPath = bins.Idemd, bins.Idemctl, bins.Etcd
	return m.Run()
}

// runOpts are the options of the tests' runs: small and short.
func runOpts(t *testing.T, scenario, brk string) Options {
	t.Helper()
	return Options{
		Scenario: scenario, Duration: 6 * time.Second, Seed: 7, OutDir: t.TempDir(), Clients: 4, Break: brk,
		StuckBound: 20 * time.Second, Idemd: idemdPath, Etcd: etcdPath, Idemctl: idemctlPath,
	}
}

// summary renders the report's terminal summary for test logs.
func summary(rep *Report) string {
	var b strings.Builder
	rep.Summary(&b)
	return b.String()
}

// TestSmoke runs a few scenarios at a small scale: every check must pass,
// and the report must be complete.
func TestSmoke(t *testing.T) {
	t.Parallel()
	opts := runOpts(t, "completed-replay,unknown-downstream,same-key-different-command,service-hop", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("smoke run failed: %s", rep.FailedChecks())
	}
	if len(rep.Scenarios) != 4 {
		t.Fatalf("%d scenario reports, want 4", len(rep.Scenarios))
	}
	for _, s := range rep.Scenarios {
		if !s.Valid || s.Ops == 0 || len(s.Faults) == 0 || len(s.Series) == 0 {
			t.Errorf("%s: valid %v, %d calls, %d faults, %d buckets", s.Name, s.Valid, s.Ops, len(s.Faults), len(s.Series))
		}
		if len(s.Checks) != len(Checks()) {
			t.Errorf("%s: %d checks, want %d", s.Name, len(s.Checks), len(Checks()))
		}
		if _, err := os.Stat(filepath.Join(opts.OutDir, s.History)); err != nil {
			t.Errorf("%s: history: %v", s.Name, err)
		}
	}
	var onDisk Report
	b, err := os.ReadFile(filepath.Join(opts.OutDir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &onDisk); err != nil || onDisk.Passed != rep.Passed || len(onDisk.Scenarios) != 4 {
		t.Errorf("report.json (%v): passed %v, %d scenarios", err, onDisk.Passed, len(onDisk.Scenarios))
	}
	html, err := os.ReadFile(filepath.Join(opts.OutDir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	checkHTML(t, string(html), rep)
}

// TestBreakModesCaught runs each deliberately broken engine with the
// scenario built to catch it: the run must fail and its report must name
// the failed check.
func TestBreakModesCaught(t *testing.T) {
	t.Parallel()
	want := map[string][]string{
		"find-then-insert": {CheckLinearizable, CheckIdenticalAnswers, CheckAckedNotLost, CheckSingleCharge, CheckSinglePayment},
		"no-fencing":       {CheckLinearizable, CheckIdenticalAnswers, CheckSweepReplays},
		"raw-body-hash":    {CheckNoFalseKeyReuse},
	}
	var mu sync.Mutex
	for _, b := range BreakModes() {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			s, err := ScenarioFor(b)
			if err != nil {
				t.Fatal(err)
			}
			opts := runOpts(t, s.Name, b)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rep, err := Run(ctx, opts)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			mu.Lock()
			t.Log("\n" + summary(rep))
			mu.Unlock()
			if rep.Passed {
				t.Fatalf("--break %s passed %s: the harness did not catch the broken engine", b, s.Name)
			}
			sr := rep.Scenarios[0]
			if !sr.Valid || sr.Error != "" {
				t.Fatalf("--break %s: the run was invalid (%s) or failed (%s), which proves nothing", b, sr.Invalid, sr.Error)
			}
			caught := slices.ContainsFunc(sr.Failed, func(c string) bool { return slices.Contains(want[b], c) })
			if !caught {
				t.Errorf("--break %s failed checks %v, want one of %v", b, sr.Failed, want[b])
			}
			// The report on disk names the failed check, with a counter-example.
			raw, err := os.ReadFile(filepath.Join(opts.OutDir, "report.json"))
			if err != nil {
				t.Fatal(err)
			}
			var onDisk Report
			if err := json.Unmarshal(raw, &onDisk); err != nil {
				t.Fatal(err)
			}
			named := false
			for _, c := range onDisk.Scenarios[0].Checks {
				if !c.Passed && slices.Contains(want[b], c.Name) && len(c.CounterExamples) > 0 {
					named = true
				}
			}
			if onDisk.Passed || !named {
				t.Errorf("report.json: passed %v, failed check with a counter-example among %v: %v", onDisk.Passed, want[b], named)
			}
		})
	}
}

// TestServiceHopOverTLS runs the forwarding scenario on a cluster with TLS
// on every link: every first attempt is forwarded over mutual TLS through
// the home node's ingress proxy (which the forwarder must verify by the
// node's identity, not the proxy's address), and every check passes.
func TestServiceHopOverTLS(t *testing.T) {
	t.Parallel()
	opts := runOpts(t, "service-hop", "")
	opts.TLS = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("service-hop over TLS failed: %s", rep.FailedChecks())
	}
	sr := rep.Scenarios[0]
	if !sr.Valid || sr.Outcomes["201"] == 0 {
		t.Errorf("valid %v, outcomes %v: want a valid run with created payments", sr.Valid, sr.Outcomes)
	}
	for outcome := range sr.Outcomes {
		if strings.Contains(outcome, "FORWARDING_NOT_AUTHENTICATED") {
			t.Errorf("a forwarded request was refused: %v", sr.Outcomes)
		}
	}
	// No node failed to forward for want of a verified peer.
	logs, _ := filepath.Glob(filepath.Join(opts.OutDir, sr.Name, "logs", "*.log"))
	if len(logs) == 0 {
		t.Fatal("no node logs kept")
	}
	for _, l := range logs {
		if base := filepath.Base(l); strings.HasPrefix(base, "etcd-") || strings.HasPrefix(base, "provider") {
			continue
		}
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "cannot forward") || strings.Contains(string(b), "certificate") {
			t.Errorf("%s shows a forwarding or certificate problem", l)
		}
	}
}

// TestSidecarCrossRegion runs the sidecar scenario briefly: the generic
// path (a --proxy-routes route in front of an upstream the harness
// observes) under cross-region races and node kills executes each command
// once, with identical answers, and every check passes.
func TestSidecarCrossRegion(t *testing.T) {
	t.Parallel()
	opts := runOpts(t, "sidecar-cross-region", "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("sidecar-cross-region failed: %s", rep.FailedChecks())
	}
	sr := rep.Scenarios[0]
	if !sr.Valid || len(sr.Faults) != 3 {
		t.Errorf("valid %v (%s), %d faults", sr.Valid, sr.Invalid, len(sr.Faults))
	}
	for _, c := range sr.Checks {
		if c.Name != CheckSidecarSingleExecution && c.Name != CheckSidecarIdenticalAnswers {
			continue
		}
		t.Logf("%s: %s", c.Name, c.Details)
		if c.Skipped || !c.Passed {
			t.Errorf("%s: skipped %v, passed %v: %s", c.Name, c.Skipped, c.Passed, c.Details)
		}
	}
	raw, err := os.ReadFile(filepath.Join(opts.OutDir, sr.Name, "sidecar.json"))
	if err != nil {
		t.Fatalf("sidecar history: %v", err)
	}
	var keys []sidecarKey
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	// The lost answers happened and were settled by the lookup (200, the
	// upstream's answer bytes), not by a second execution.
	statuses := map[int]int{}
	for _, k := range keys {
		for _, a := range k.Answers {
			statuses[a.Status]++
		}
	}
	t.Logf("sidecar answers by status: %v", statuses)
	if statuses[202] == 0 || statuses[200] == 0 || statuses[201] == 0 {
		t.Errorf("answers by status %v: want lost answers (202) settled by lookup (200) besides 201", statuses)
	}
}

// TestDockerEnvironment runs, in the docker environment (each region on a
// network of its own, partitions at the network layer: packets dropped,
// nothing closed), a region failover and the one-way partition: every
// check must pass, the drill's bounds included. (The other region
// scenarios run there with idemctl chaos run --env docker, docs/chaos.md.)
// Without a Docker engine or the images it skips, saying which.
func TestDockerEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := cluster.DockerAvailable(ctx); err != nil {
		t.Skipf("docker environment unavailable: %v", err)
	}
	opts := runOpts(t, "region-failover,partition-one-way", "")
	opts.Env = EnvDocker
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log("\n" + summary(rep))
	if !rep.Passed {
		t.Errorf("docker run failed: %s", rep.FailedChecks())
	}
	if rep.Env != EnvDocker || len(rep.Scenarios) != 2 {
		t.Fatalf("env %q, %d scenario reports, want docker and 2", rep.Env, len(rep.Scenarios))
	}
	for _, s := range rep.Scenarios {
		if !s.Valid || s.Ops == 0 || len(s.Faults) == 0 || s.Faults[0].Skipped != "" {
			t.Errorf("%s: valid %v, %d calls, faults %+v", s.Name, s.Valid, s.Ops, s.Faults)
		}
	}
}

// TestEnvironments checks which scenarios run where (and that the
// scenario behind PgBouncer refuses TLS, which its PgBouncer cannot
// terminate).
func TestEnvironments(t *testing.T) {
	for _, s := range Catalogue() {
		inProcess, _ := s.RunsIn(EnvProcess)
		inDocker, why := s.RunsIn(EnvDocker)
		switch {
		case s.DockerOnly && (inProcess || !inDocker):
			t.Errorf("%s is docker-only: process %v, docker %v", s.Name, inProcess, inDocker)
		case (s.StoreHA || s.Sidecar || s.PgBouncer) && inDocker:
			t.Errorf("%s runs in docker, but it needs the process environment", s.Name)
		case !inDocker && why == "":
			t.Errorf("%s: no reason given for not running in docker", s.Name)
		}
	}
	opts := runOpts(t, "partition-one-way", "")
	if _, err := Run(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "does not run in the process environment") {
		t.Errorf("partition-one-way in the process environment: %v", err)
	}
	opts = runOpts(t, "pgbouncer-restart", "")
	opts.TLS = true
	if _, err := Run(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "does not run with TLS") {
		t.Errorf("pgbouncer-restart with TLS: %v", err)
	}
	opts = runOpts(t, "completed-replay", "")
	opts.Env = "vm"
	if _, err := Run(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "unknown environment") {
		t.Errorf("an unknown environment: %v", err)
	}
}

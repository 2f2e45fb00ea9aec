//go:build !operator

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idemcoord/idem/chaos"
	"github.com/idemcoord/idem/cluster"
)

// errDrillFailed is returned when a drill ran but a check or a drill
// figure missed its bound (exit status 1, after the summary).
var errDrillFailed = errors.New("drill failed (see the summary and the report)")

// runDrill implements "idemctl drill": a failover drill against a running
// cluster, with the chaos harness's workload, checks and report.
func runDrill(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	clusterFile := fs.String("cluster", "", "the cluster's description (the cluster.json idemctl up writes in its --state-dir) (required)")
	region := fs.String("region", "", "region the drill takes down (required)")
	inject := fs.String("inject", "", "command (run with sh -c) that takes --region down: kill or stop its processes, cut its network (required)")
	heal := fs.String("heal", "", "command (run with sh -c) that brings --region back; empty when it stays down (its store, if it still answers, is taken over by the new home; if it does not, the drill reports what was lost with it)")
	mode := fs.String("failover", chaos.FailoverManual, "manual: the drill fails --region over once its leases lapsed (as idemctl region failover); auto: the nodes do (idemd --auto-failover-after), the drill only waits")
	to := fs.String("to", "", "region a manual failover moves --region's tenants to (default: the first other region)")
	hold := fs.Duration("hold", 2*time.Second, "how long --region stays down after the failover before --heal")
	leaseTTL := fs.Duration("region-lease-ttl", cluster.DefaultRegionLeaseTTL, "the nodes' --region-lease-ttl; the RTO bound is this + 3s")
	duration := fs.Duration("duration", chaos.DefaultDuration, "traffic time, the fault included")
	seed := fs.Uint64("seed", 1, "seed of every random choice of the workload")
	out := fs.String("out", "drill-report", "directory for report.json, report.html and the history")
	clients := fs.Int("clients", chaos.DefaultClients, "concurrent clients")
	minRate := fs.Float64("min-rate", chaos.DefaultMinRate, "minimum calls/s before the fault; below it the drill is invalid")
	stuck := fs.Duration("stuck-bound", chaos.DefaultStuckBound, "how long after the traffic every open record and backlog must settle")
	verbose := fs.Bool("v", false, "log the drill's progress to stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemctl drill --cluster cluster.json --region R --inject CMD [--heal CMD] [--failover auto|manual] [flags]\n\n"+
			"Runs a failover drill against a running cluster: sends the chaos workload to every node, runs --inject after\n"+
			"the warm-up, performs or waits for the failover of --region, runs --heal, hands the region's records over, and\n"+
			"checks and reports like idemctl chaos run, with the drill figures (RTO per tenant, acknowledged answers lost,\n"+
			"duplicate effects, records stuck) at the top of report.html. Exits 1 when a check or a figure misses its bound.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if *clusterFile == "" || *region == "" || strings.TrimSpace(*inject) == "" {
		return usageError{errors.New("--cluster, --region and --inject are required")}
	}
	if *mode != chaos.FailoverManual && *mode != chaos.FailoverAuto {
		return usageError{fmt.Errorf("--failover %q: want %s or %s", *mode, chaos.FailoverManual, chaos.FailoverAuto)}
	}
	if *duration < 5*time.Second {
		return usageError{fmt.Errorf("--duration %v: want at least 5s", *duration)}
	}
	if *clients < 1 {
		return usageError{fmt.Errorf("--clients %d: want at least 1", *clients)}
	}
	b, err := os.ReadFile(*clusterFile)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	var info cluster.Info
	if err := json.Unmarshal(b, &info); err != nil {
		return fmt.Errorf("--cluster %s: %w", *clusterFile, err)
	}
	opts := chaos.DrillOptions{
		Cluster: info, Region: *region, Inject: *inject, Heal: *heal, Failover: *mode, To: *to, Hold: *hold,
		LeaseTTL: *leaseTTL, Duration: *duration, Seed: *seed, Clients: *clients, MinRate: *minRate,
		StuckBound: *stuck, OutDir: *out,
		Progress: env.Stderr, ProgressTTY: isTerminal(env.Stderr),
		Command: "idemctl drill " + strings.Join(quoteArgs(args), " "),
	}
	if *verbose {
		opts.Logger = slog.New(slog.NewTextHandler(env.Stderr, nil))
	}
	rep, err := chaos.RunDrill(ctx, opts)
	if rep != nil {
		rep.Summary(env.Stdout)
		if len(rep.Scenarios) > 0 {
			if d := rep.Scenarios[0].Drill; d != nil {
				fmt.Fprintf(env.Stdout, "drill: RTO max %.2fs (bound %.1fs), acknowledged answers lost %d, duplicate charges %d, payments %d, ledger entries %d, emails %d, records stuck %d, calls redirected to a live region %d\n",
					d.RTOMaxSeconds, d.RTOBoundSeconds, d.AckedLost, d.DuplicateCharges, d.DuplicatePayments, d.DuplicateLedgerEntries, d.DuplicateEmails, d.RecordsStuck, d.Redirected)
				if d.StoreLost {
					fmt.Fprintf(env.Stdout, "drill: %s's store was lost with it: %d acknowledged answer(s) no longer replayed (records lost), %d acknowledged payment(s) without their ledger entry (effects lost)\n",
						d.Region, d.AnswersLost, d.EffectsLost)
				}
			}
		}
		fmt.Fprintf(env.Stdout, "report: %s/report.html\n", strings.TrimSuffix(*out, "/"))
	}
	if err != nil {
		return err
	}
	if !rep.Passed {
		return fmt.Errorf("%w: %s", errDrillFailed, strings.Join(rep.FailedChecks(), ", "))
	}
	return nil
}

// quoteArgs quotes the arguments that hold spaces, for the report's
// command line.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

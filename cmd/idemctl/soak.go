//go:build !operator

package main

import (
	"context"
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

// errSoakFailed is returned when a soak ran but a check failed (exit
// status 1, after the summary).
var errSoakFailed = errors.New("soak failed (see the summary and the report)")

// runSoak implements "idemctl soak": a cluster shaped as idemctl up's,
// mixed traffic and faults for --duration, samples of the nodes' metrics,
// the stores and the provider, and a report that fails on growth that does
// not level off and on throughput or p99 that drifts.
func runSoak(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	duration := fs.Duration("duration", chaos.DefaultSoakDuration, "how long the traffic runs")
	interval := fs.Duration("interval", chaos.DefaultSoakInterval, "how often to sample throughput, latency, the nodes' metrics, the stores and the provider")
	faultEvery := fs.Duration("fault-every", chaos.DefaultSoakFaultEvery, "time between two faults (node killed, node paused, etcd member or leader killed, provider failing); 0: none")
	clients := fs.Int("clients", chaos.DefaultSoakClients, "concurrent closed-loop clients")
	seed := fs.Uint64("seed", 1, "seed of the clients' choices")
	out := fs.String("out", "soak-report", "directory for soak.json, soak.html, soak.svg and the cluster's logs")
	regions := fs.String("regions", strings.Join(chaos.DefaultRegions(), ","), "region names")
	nodes := fs.Int("nodes-per-region", 1, "idemd nodes per region")
	stateDir := fs.String("state-dir", "", "the cluster's state directory, kept afterwards (default: a temporary one, removed)")
	noSidecar := fs.Bool("no-sidecar", false, "run without the sidecar route and its calls")
	idemd := fs.String("idemd", "", "idemd binary (default: next to idemctl, then ./bin, then PATH)")
	etcd := fs.String("etcd", "", "etcd binary (default: next to idemctl, then ./bin, then PATH)")
	verbose := fs.Bool("v", false, "log the cluster's progress to stderr")
	reportFrom := fs.String("report-from", "", "run nothing: judge the samples of this soak.json again and write its report (soak.html, soak.svg, soak.json) into --out")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemctl soak [flags] [-- idemd flags]\n\n"+
			"Starts a cluster shaped as idemctl up's, runs fresh payments, replays, reused keys, forwarded calls and\n"+
			"sidecar calls with a fault every --fault-every for --duration, samples every --interval, and writes a report.\n"+
			"Exits 1 when memory, goroutines or descriptors keep growing, or throughput or p99 drift.\n"+
			"Arguments after -- are passed to every idemd. Build the binaries first: %s\n\nflags:\n", cluster.BuildCommand)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if *reportFrom != "" {
		return soakReportFrom(*reportFrom, *out, env)
	}
	if *duration < time.Minute {
		return usageError{fmt.Errorf("--duration %v: want at least 1m", *duration)}
	}
	if *interval < time.Second || *interval > *duration/4 {
		return usageError{fmt.Errorf("--interval %v: want at least 1s and at most a quarter of --duration", *interval)}
	}
	if *clients < 1 || *nodes < 1 || *faultEvery < 0 {
		return usageError{errors.New("--clients and --nodes-per-region must be at least 1, --fault-every not negative")}
	}
	var regionList []string
	for _, r := range strings.Split(*regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			regionList = append(regionList, r)
		}
	}
	if len(regionList) < 2 {
		return usageError{errors.New("--regions needs at least two regions (forwarded calls go to a region that is not the tenant's home)")}
	}
	opts := chaos.SoakOptions{
		Duration: *duration, Interval: *interval, FaultEvery: *faultEvery, Clients: *clients, Seed: *seed, OutDir: *out,
		Regions: regionList, NodesPerRegion: *nodes, StateDir: *stateDir, NoSidecar: *noSidecar, NodeArgs: fs.Args(),
		Idemd: *idemd, Etcd: *etcd, Progress: env.Stderr, Command: "idemctl soak " + strings.Join(args, " "),
	}
	if *faultEvery == 0 {
		opts.FaultEvery = -1
	}
	if *verbose {
		opts.Logger = slog.New(slog.NewTextHandler(env.Stderr, nil))
	}
	var err error
	if opts.Idemd == "" {
		if opts.Idemd, err = cluster.FindBinary("idemd"); err != nil {
			return err
		}
	}
	if opts.Etcd == "" {
		if opts.Etcd, err = cluster.FindBinary("etcd"); err != nil {
			return err
		}
	}
	if opts.Idemctl, err = cluster.FindIdemctl(); err != nil {
		return err
	}
	rep, err := chaos.RunSoak(ctx, opts)
	if rep != nil {
		rep.Summary(env.Stdout)
		fmt.Fprintf(env.Stdout, "report: %s/soak.html\n", strings.TrimSuffix(*out, "/"))
	}
	if err != nil {
		return err
	}
	if !rep.Passed {
		return errSoakFailed
	}
	return nil
}

// soakReportFrom writes the report of a soak.json again (an interrupted
// run's, or one judged by an earlier build) and prints its summary.
func soakReportFrom(path, out string, env *Env) error {
	rep, err := chaos.ReadSoakReport(path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("soak: output directory: %w", err)
	}
	if err := rep.Write(out); err != nil {
		return err
	}
	rep.Summary(env.Stdout)
	fmt.Fprintf(env.Stdout, "report: %s/soak.html\n", strings.TrimSuffix(out, "/"))
	if !rep.Passed {
		return errSoakFailed
	}
	return nil
}

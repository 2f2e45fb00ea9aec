//go:build !operator

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemcoord/idem/chaos"
	"github.com/idemcoord/idem/cluster"
)

// errChaosFailed is returned when a chaos run completes but a check failed
// or the run was invalid (exit status 1, after the summary).
var errChaosFailed = errors.New("chaos run failed (see the summary and the report)")

// runChaos implements "idemctl chaos list" and "idemctl chaos run".
func runChaos(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: idemctl chaos list | run --scenario NAME|all [flags]")}
	}
	switch args[0] {
	case "list":
		return chaosList(args[1:], env)
	case "run":
		return chaosRun(ctx, args[1:], env)
	}
	return usageError{fmt.Errorf("unknown chaos command %q (want list or run)", args[0])}
}

// chaosList prints the catalogue: each scenario's name and description.
func chaosList(args []string, env *Env) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %q", args)}
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	for _, s := range chaos.Catalogue() {
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Description)
	}
	return tw.Flush()
}

// chaosOptions parses "chaos run" flags into chaos.Options.
func chaosOptions(args []string, env *Env) (chaos.Options, error) {
	fs := flag.NewFlagSet("chaos run", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	scenario := fs.String("scenario", "", "scenario name, comma-separated names, or all (see idemctl chaos list)")
	duration := fs.Duration("duration", chaos.DefaultDuration, "traffic time per scenario, faults included")
	seed := fs.Uint64("seed", 1, "seed of every random choice of the workload")
	out := fs.String("out", "chaos-report", "directory for report.json, report.html and each scenario's history and logs")
	clients := fs.Int("clients", chaos.DefaultClients, "concurrent clients")
	regions := fs.String("regions", strings.Join(chaos.DefaultRegions(), ","), "region names; a scenario uses as many as it needs")
	nodes := fs.Int("nodes-per-region", 0, "idemd nodes per region (default: the scenario's, 2)")
	brk := fs.String("break", "", "run a deliberately broken engine the run must catch: "+strings.Join(chaos.BreakModes(), ", "))
	minRate := fs.Float64("min-rate", chaos.DefaultMinRate, "minimum calls/s before the first fault; below it the run is invalid")
	stuck := fs.Duration("stuck-bound", chaos.DefaultStuckBound, "how long after the traffic every open record and backlog must settle")
	idemd := fs.String("idemd", "", "idemd binary (default: next to idemctl, then ./bin, then PATH)")
	etcd := fs.String("etcd", "", "etcd binary (default: next to idemctl, then ./bin, then PATH)")
	envName := fs.String("env", chaos.EnvProcess, "where the clusters run: "+strings.Join(chaos.Envs(), " or ")+
		" (containers, a network per region, partitions at the network layer; needs idemctl images build)")
	withTLS := fs.Bool("tls", false, "run the clusters with TLS on every link (as idemctl up --tls): nodes forward over mutual TLS through the proxies")
	verbose := fs.Bool("v", false, "log the cluster's progress to stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemctl chaos run --scenario NAME|all [flags]\n\n"+
			"Starts a proxied cluster per scenario (PostgreSQL, 3 etcd members, the provider simulator, idemd nodes),\n"+
			"runs clients while faults are injected, checks the history and the stores, and writes a report.\n"+
			"Exits 1 when a check fails or the run is invalid. Build the binaries first, idemd with fault injection: %s\n\nflags:\n", chaos.BuildCommand)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env); err != nil {
		return chaos.Options{}, err
	}
	if *scenario == "" {
		return chaos.Options{}, usageError{errors.New("--scenario is required (see idemctl chaos list)")}
	}
	if *scenario != "all" {
		for _, name := range strings.Split(*scenario, ",") {
			if _, err := chaos.Lookup(strings.TrimSpace(name)); err != nil {
				return chaos.Options{}, usageError{err}
			}
		}
	}
	if *brk != "" {
		if _, err := chaos.ScenarioFor(*brk); err != nil {
			return chaos.Options{}, usageError{err}
		}
	}
	if *duration < 5*time.Second {
		return chaos.Options{}, usageError{fmt.Errorf("--duration %v: want at least 5s", *duration)}
	}
	if *clients < 1 {
		return chaos.Options{}, usageError{fmt.Errorf("--clients %d: want at least 1", *clients)}
	}
	var regionList []string
	for _, r := range strings.Split(*regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			regionList = append(regionList, r)
		}
	}
	if len(regionList) < 2 {
		return chaos.Options{}, usageError{errors.New("--regions needs at least two regions")}
	}
	opts := chaos.Options{
		Scenario: *scenario, Duration: *duration, Seed: *seed, OutDir: *out, Clients: *clients,
		Regions: regionList, NodesPerRegion: *nodes, Break: *brk, MinRate: *minRate, StuckBound: *stuck,
		Idemd: *idemd, Etcd: *etcd, TLS: *withTLS, Env: *envName,
	}
	if *verbose {
		opts.Logger = slog.New(slog.NewTextHandler(env.Stderr, nil))
	}
	return opts, nil
}

// chaosRun runs the scenarios, prints the summary and returns
// errChaosFailed when a check failed or the run was invalid.
func chaosRun(ctx context.Context, args []string, env *Env) error {
	opts, err := chaosOptions(args, env)
	if err != nil {
		return err
	}
	if opts.Idemd == "" {
		if opts.Idemd, err = cluster.FindBinary("idemd"); err != nil {
			return err
		}
	}
	if err := chaos.RequireFailpoints(opts.Idemd); err != nil {
		return err
	}
	if opts.Etcd == "" {
		if opts.Etcd, err = cluster.FindBinary("etcd"); err != nil {
			return err
		}
	}
	if opts.Idemctl, err = cluster.FindIdemctl(); err != nil {
		return err
	}
	opts.Progress, opts.ProgressTTY = env.Stderr, isTerminal(env.Stderr)
	opts.Command = "idemctl chaos run " + strings.Join(args, " ")
	rep, err := chaos.Run(ctx, opts)
	if rep != nil {
		rep.Summary(env.Stdout)
		fmt.Fprintf(env.Stdout, "report: %s/report.html\n", strings.TrimSuffix(opts.OutDir, "/"))
	}
	if err != nil {
		return err
	}
	if !rep.Passed {
		return fmt.Errorf("%w: %s", errChaosFailed, strings.Join(rep.FailedChecks(), ", "))
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

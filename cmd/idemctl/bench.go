//go:build !operator

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem/cmd/idemctl/internal/bench"
	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

func runBench(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	url := fs.String("database-url", "", "store to benchmark against; default: start a throwaway PostgreSQL with fsync on")
	concurrency := fs.Int("concurrency", 8, "concurrent workers")
	maxConns := fs.Int("max-conns", 0, "connection pool size of each store; default: concurrency + 4")
	duration := fs.Duration("duration", 3*time.Second, "length of each phase")
	rounds := fs.Int("rounds", 3, "how many times baseline and idempotent phases alternate")
	suite := fs.String("suite", bench.SuiteStore, "what to measure: "+strings.Join(bench.Suites, ", ")+" or all (comma-separated list allowed)")
	replayKeys := fs.Int("replay-keys", 1000, "completed keys the replay suite retries in turn")
	scaleRows := fs.String("scale-rows", "10000,1000000", "records table sizes the scale suite claims at, ascending, comma-separated (e.g. 10000,1000000,10000000)")
	cleanupExpired := fs.Int("cleanup-expired", 20000, "records of each of four kinds loaded before each phase of the scale suite with cleanup running: past the window with a stored answer or a reference, past the metadata retention pruned or referencing")
	expiredMetadata := fs.Int("expired-metadata", 1000000, "records of expired metadata (a week's, kept by default) in the table while the scale suite's cleanup runs; negative: none")
	keys := fs.String("keys", bench.KeysRandom, "order of fresh requests' idempotency keys: random (as UUIDs) or sequential (numbered)")
	out := fs.String("out", "", "also write the report as JSON to this file")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (clients and the layer) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	var rows []int
	for _, f := range strings.Split(*scaleRows, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || len(rows) > 0 && n < rows[len(rows)-1] {
			return usageError{fmt.Errorf("bench: --scale-rows %q: want ascending positive counts", *scaleRows)}
		}
		rows = append(rows, n)
	}
	if *keys != bench.KeysRandom && *keys != bench.KeysSequential {
		return usageError{fmt.Errorf("bench: --keys %q: want %s or %s", *keys, bench.KeysRandom, bench.KeysSequential)}
	}
	suites := strings.Split(*suite, ",")
	for _, name := range suites {
		if name != "all" && !slices.Contains(bench.Suites, name) {
			return usageError{fmt.Errorf("bench: unknown suite %q (want %s or all)", name, strings.Join(bench.Suites, ", "))}
		}
	}
	if *url == "" {
		fmt.Fprintln(env.Stderr, "starting a throwaway PostgreSQL (fsync on)...")
		srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true})
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop(context.Background()) }()
		if *url, err = srv.CreateDatabase(ctx, "idem_bench"); err != nil {
			return err
		}
	}
	if *maxConns <= 0 {
		*maxConns = *concurrency + 4
	}
	st, err := store.Open(ctx, *url, store.Options{MaxConns: int32(*maxConns)})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := payments.Migrate(ctx, st); err != nil {
		return err
	}
	// The same database without the replay fast path, measured side by side.
	claimFirst, err := store.Open(ctx, *url, store.Options{MaxConns: int32(*maxConns), NoReplayRead: true})
	if err != nil {
		return err
	}
	defer claimFirst.Close()
	// And without group commit, for the sidecar suite.
	noGroupCommit, err := store.Open(ctx, *url, store.Options{MaxConns: int32(*maxConns), NoGroupCommit: true})
	if err != nil {
		return err
	}
	defer noGroupCommit.Close()
	// And a pool of the sidecar's own, as idemd has beside its upstream.
	sidecarStore, err := store.Open(ctx, *url, store.Options{MaxConns: int32(*maxConns)})
	if err != nil {
		return err
	}
	defer sidecarStore.Close()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(env.Stderr, "GOMAXPROCS %d, CPUs %d\n", runtime.GOMAXPROCS(0), runtime.NumCPU())
	rep, err := bench.Run(ctx, st, bench.Config{Concurrency: *concurrency, PhaseDuration: *duration, Rounds: *rounds,
		ReplayKeys: *replayKeys, Keys: *keys, ScaleRows: rows, CleanupExpired: *cleanupExpired, ExpiredMetadata: *expiredMetadata, ClaimFirst: claimFirst, NoGroupCommit: noGroupCommit, Sidecar: sidecarStore, Progress: env.Stderr}, suites...)
	if err != nil {
		return err
	}
	if *out != "" {
		raw, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprint(env.Stdout, rep.Markdown())
	return nil
}

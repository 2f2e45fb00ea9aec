package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/idemcoord/idem/internal/bench"
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
	duration := fs.Duration("duration", 3*time.Second, "length of each phase")
	rounds := fs.Int("rounds", 3, "how many times baseline and idempotent phases alternate")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
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
	st, err := store.Open(ctx, *url, store.Options{MaxConns: int32(*concurrency + 4)})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := payments.Migrate(ctx, st); err != nil {
		return err
	}
	rep, err := bench.Run(ctx, st, bench.Config{Concurrency: *concurrency, PhaseDuration: *duration, Rounds: *rounds, Progress: env.Stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprint(env.Stdout, rep.Markdown())
	return nil
}

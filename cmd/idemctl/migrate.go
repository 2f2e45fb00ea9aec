package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

func runMigrate(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	url := fs.String("database-url", "", "PostgreSQL or CockroachDB URL of the idempotency store (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	if *url == "" {
		return usageError{fmt.Errorf("--database-url (or %s) is required", cli.EnvName("database-url"))}
	}
	st, err := store.Open(ctx, *url, store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := payments.Migrate(ctx, st); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "migrations applied")
	return nil
}

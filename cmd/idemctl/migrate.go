package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// runMigrate applies the engine's and payments' migrations ("idemctl
// migrate"), or lists each set's applied and pending versions ("idemctl
// migrate status").
func runMigrate(ctx context.Context, args []string, env *Env) error {
	status := len(args) > 0 && args[0] == "status"
	name := "migrate"
	if status {
		args, name = args[1:], "migrate status"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	url := fs.String("database-url", "", "PostgreSQL or CockroachDB URL of the idempotency store (required)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: idemctl migrate [status] --database-url URL")
		fmt.Fprintln(fs.Output(), "\nmigrate applies the engine's and payments' migrations; migrate status lists, per set, the versions applied and pending.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	if *url == "" {
		return usageError{fmt.Errorf("--database-url (or %s) is required", cli.EnvName("database-url"))}
	}
	st, err := store.Open(ctx, *url, store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if status {
		sets, err := st.MigrationStatus(ctx, payments.Migrations())
		if err != nil {
			return err
		}
		for _, set := range sets {
			fmt.Fprintln(env.Stdout, setStatusLine(set))
		}
		return nil
	}
	if err := payments.Migrate(ctx, st); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "migrations applied")
	return nil
}

// setStatusLine is one set's line of migrate status:
//
//	engine    applied 0001 0004 0006; pending 0007
func setStatusLine(s store.SetStatus) string {
	line := fmt.Sprintf("%-9s applied %s; pending %s", s.Name, versionList(s.Applied), versionList(s.Pending))
	if len(s.Unknown) > 0 {
		line += "; recorded but not known to this release " + versionList(s.Unknown)
	}
	return line
}

func versionList(versions []int) string {
	if len(versions) == 0 {
		return "none"
	}
	out := make([]string, len(versions))
	for i, v := range versions {
		out[i] = fmt.Sprintf("%04d", v)
	}
	return strings.Join(out, " ")
}

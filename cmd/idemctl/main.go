// Command idemctl operates the idempotency coordination service: it starts a
// local cluster, applies migrations, runs benchmarks and serves the payment
// provider simulator. Run "idemctl help" for the list of commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/idemcoord/idem/internal/cli"
)

// command is one idemctl subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, env *Env) error
}

// Env is what a command may use of its surroundings, injected for tests.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// commands is the operator's commands and, unless idemctl is built with the
// operator tag (the production image's build), the tooling's (toolingCommands).
func commands() map[string]command {
	cmds := map[string]command{
		"migrate":     {"apply the store's migrations to --database-url; migrate status lists each set's applied and pending versions", runMigrate},
		"provider":    {"serve the payment provider simulator", runProvider},
		"placement":   {"get or set a tenant's home region (placement get|set --tenant T [--region R]), or the default regions (placement defaults --regions A,B)", runPlacement},
		"region":      {"region status, failover --from A --to B, failback --region A, handover of a failed region's records", runRegion},
		"healthcheck": {"GET a URL and exit non-zero unless it answers 200 (the idem image's container health check)", runHealthcheck},
		"records":     {"find, show and settle by hand the records recovery cannot settle (records list|show|settle), over --database-url or a node's admin API (--node)", runRecords},
	}
	for name, c := range toolingCommands() {
		cmds[name] = c
	}
	return cmds
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(Run(ctx, os.Args[1:], env))
}

// Run runs the subcommand named by args[0] and returns the exit code.
func Run(ctx context.Context, args []string, env *Env) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(env.Stdout, cmds)
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "idemctl: unknown command %q\n\n", args[0])
		usage(env.Stderr, cmds)
		return 2
	}
	if err := cmd.run(ctx, args[1:], env); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var usageErr usageError
		if errors.As(err, &usageErr) {
			fmt.Fprintf(env.Stderr, "idemctl %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(env.Stderr, "idemctl %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError marks a command-line mistake (exit status 2).
type usageError struct{ error }

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: idemctl <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nEvery flag can also be set as IDEM_<FLAG> (--database-url as IDEM_DATABASE_URL).")
}

// parseFlags parses args into fs, then the IDEM_* environment for flags not
// given, and refuses positional arguments. A malformed flag is a
// usageError (exit 2); -h is flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, env *Env) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	return nil
}

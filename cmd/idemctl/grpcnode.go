//go:build !operator

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemcoord/idem/chaos"
)

// runGRPCNode serves the gRPC chaos scenario's service (Transfers/Create
// through idemgrpc on --database-url) until interrupted: the processes the
// harness kills mid-call in the grpc-kill scenario. Its tenant's bearer
// token comes from IDEM_GRPC_TOKEN, never from the command line.
func runGRPCNode(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("grpc-node", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:9090", "address to serve gRPC on")
	databaseURL := fs.String("database-url", "", "the store's PostgreSQL URL (its effects table must exist)")
	name := fs.String("name", "grpc-node", "the node's name in the records it owns")
	lockTimeout := fs.Duration("lock-timeout", 3*time.Second, "how long a killed node's call blocks its key before a retry takes it over")
	hold := fs.Duration("hold", 150*time.Millisecond, "how long a call is held after its side effect, before it answers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *databaseURL == "" {
		return usageError{fmt.Errorf("--database-url is required")}
	}
	return chaos.RunGRPCNode(ctx, chaos.GRPCNodeConfig{
		Listen: *listen, DatabaseURL: *databaseURL, Token: env.Getenv("IDEM_GRPC_TOKEN"), Name: *name,
		LockFor: *lockTimeout, Hold: *hold, Stdout: env.Stdout,
		Logger: slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

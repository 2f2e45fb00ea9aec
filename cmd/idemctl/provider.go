package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/provider"
)

// runProvider serves the payment provider simulator until interrupted.
func runProvider(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the simulator on")
	dataDir := fs.String("data-dir", "", "directory where charges are persisted (empty: in memory only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	logger := slog.New(slog.NewTextHandler(env.Stderr, nil))
	return provider.ListenAndServe(ctx, *listen, provider.Config{DataDir: *dataDir, Logger: logger})
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/provider"
)

// runProvider serves the payment provider simulator until interrupted.
func runProvider(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the simulator on")
	dataDir := fs.String("data-dir", "", "directory where charges are persisted (empty: in memory only)")
	certFile := fs.String("tls-cert", "", "certificate (PEM) to serve HTTPS with; reloaded when it changes (needs --tls-key)")
	keyFile := fs.String("tls-key", "", "private key (PEM) of --tls-cert")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	if (*certFile == "") != (*keyFile == "") {
		return usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	logger := slog.New(slog.NewTextHandler(env.Stderr, nil))
	cfg := provider.Config{DataDir: *dataDir, Logger: logger}
	if *certFile == "" {
		return provider.ListenAndServe(ctx, *listen, cfg)
	}
	cert, err := tlsutil.NewReloader(*certFile, *keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *listen)
	if err != nil {
		return fmt.Errorf("provider: listen %s: %w", *listen, err)
	}
	return provider.Serve(ctx, tls.NewListener(ln, tlsutil.ServerConfig(cert, nil)), cfg)
}

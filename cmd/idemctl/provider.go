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
	"github.com/idemcoord/idem/provider/simulator"
)

// runProvider serves the payment provider simulator until interrupted. It
// requires an API key (charges) and an admin key (faults, counts), read
// from files or environment variables, never from the command line.
func runProvider(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the simulator on")
	dataDir := fs.String("data-dir", "", "directory where charges are persisted (empty: in memory only)")
	certFile := fs.String("tls-cert", "", "certificate (PEM) to serve HTTPS with; reloaded when it changes (needs --tls-key)")
	keyFile := fs.String("tls-key", "", "private key (PEM) of --tls-cert")
	apiKeyFile := fs.String("api-key-file", "", "file holding the API key clients must send as a bearer token on /v1/charges (or IDEM_PROVIDER_API_KEY)")
	adminKeyFile := fs.String("admin-key-file", "", "file holding the key required on the /admin endpoints (or IDEM_PROVIDER_ADMIN_KEY)")
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
	apiKey, err := providerKey(logger, "--api-key-file", *apiKeyFile, "IDEM_PROVIDER_API_KEY", env.Getenv)
	if err != nil {
		return usageError{err}
	}
	adminKey, err := providerKey(logger, "--admin-key-file", *adminKeyFile, "IDEM_PROVIDER_ADMIN_KEY", env.Getenv)
	if err != nil {
		return usageError{err}
	}
	if apiKey == adminKey {
		return usageError{errors.New("the API key and the admin key are the same; give the admin endpoints a key of their own")}
	}
	cfg := simulator.Config{DataDir: *dataDir, Logger: logger, APIKey: apiKey, AdminKey: adminKey}
	if *certFile == "" {
		return simulator.ListenAndServe(ctx, *listen, cfg)
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
	return simulator.Serve(ctx, tls.NewListener(ln, tlsutil.ServerConfig(cert, nil)), cfg)
}

// providerKey reads a required key from file or, without one, from the
// environment variable envName.
func providerKey(logger *slog.Logger, flagName, file, envName string, getenv func(string) string) (string, error) {
	key, warn, err := cli.KeyFromFileOrEnv(flagName, file, envName, getenv(envName))
	if warn != "" {
		logger.Warn(warn)
	}
	if err == nil && key == "" {
		err = fmt.Errorf("%s (or %s) is required: the simulator refuses to serve without keys", flagName, envName)
	}
	return key, err
}

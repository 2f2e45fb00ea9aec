// Command idemd is a regional node of the idempotency coordination service.
// It applies migrations, then serves the payment API, idempotency record
// inspection, metrics and health checks. Every flag can also be set as an
// IDEM_* environment variable (--database-url as IDEM_DATABASE_URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:], os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "idemd:", err)
		os.Exit(2)
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "idemd:", err)
		os.Exit(1)
	}
	<-ctx.Done()
	if err := m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "idemd:", err)
		os.Exit(1)
	}
}

// Main is the program: flags, wiring, lifecycle.
type Main struct {
	Listen       string
	Region       string
	DatabaseURL  string
	AuthTokens   map[string]string
	ReplayWindow time.Duration
	LockFor      time.Duration

	logger *slog.Logger
	store  *store.Store
	server *region.Server
}

// NewMain returns a Main with defaults.
func NewMain() *Main {
	return &Main{logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
}

// ParseFlags parses args, falling back to IDEM_* variables read with getenv.
func (m *Main) ParseFlags(args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("idemd", flag.ContinueOnError)
	fs.StringVar(&m.Listen, "listen", region.DefaultAddr, "address to serve HTTP on")
	fs.StringVar(&m.Region, "region", "local", "name of this node's region")
	fs.StringVar(&m.DatabaseURL, "database-url", "", "PostgreSQL or CockroachDB URL of the idempotency store (required)")
	tokens := fs.String("auth-tokens", "", "bearer tokens and their tenants: token=tenant,token2=tenant2")
	fs.DurationVar(&m.ReplayWindow, "replay-window", payments.DefaultWindow, "how long a key's record answers retries")
	fs.DurationVar(&m.LockFor, "lock-timeout", payments.DefaultLockFor, "how long an owner holds a key before a retry may take it over")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, getenv); err != nil {
		return err
	}
	if m.DatabaseURL == "" {
		return fmt.Errorf("--database-url (or %s) is required", cli.EnvName("database-url"))
	}
	var err error
	if m.AuthTokens, err = cli.ParseTokens(*tokens); err != nil {
		return err
	}
	if len(m.AuthTokens) == 0 {
		m.logger.Warn("no --auth-tokens: every authenticated endpoint will answer 401")
	}
	return nil
}

// Run connects to the store, applies migrations and starts serving. It
// returns once the node is listening.
func (m *Main) Run(ctx context.Context) error {
	st, err := store.Open(ctx, m.DatabaseURL, store.Options{Logger: m.logger})
	if err != nil {
		return err
	}
	m.store = st
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	host, _ := os.Hostname()
	pay := payments.NewService(st, payments.Config{
		Region: m.Region, Owner: fmt.Sprintf("%s/%s/%d", m.Region, host, os.Getpid()),
		Window: m.ReplayWindow, LockFor: m.LockFor, Logger: m.logger,
	})
	srv, err := region.NewServer(region.Config{Addr: m.Listen, Region: m.Region, Tokens: m.AuthTokens, Logger: m.logger}, st, pay)
	if err != nil {
		return err
	}
	if err := srv.Open(); err != nil {
		return err
	}
	m.server = srv
	m.logger.Info("idemd serving", "region", m.Region, "url", srv.URL(), "replay_window", m.ReplayWindow)
	return nil
}

// Close stops serving (waiting up to 10s for running requests) and closes the
// store.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if m.server != nil {
		err = m.server.Close(ctx)
	}
	if m.store != nil {
		m.store.Close()
	}
	return err
}

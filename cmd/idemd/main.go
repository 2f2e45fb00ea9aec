// Command idemd is a regional node of the idempotency coordination service.
// It applies migrations (unless --migrate=false), then serves the payment
// API, idempotency record inspection, metrics and health checks. Every flag
// can also be set as an IDEM_* environment variable (--database-url as
// IDEM_DATABASE_URL). Secrets are never flags: bearer tokens come from
// --auth-tokens-file (or IDEM_AUTH_TOKENS) and the provider's API key from
// --provider-api-key-file (or IDEM_PROVIDER_API_KEY), because a command
// line is readable by every local user.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/etcdclient"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

// DefaultAnswerCacheBytes is --answer-cache-bytes' default: 64 MiB of
// settled answers (some 100,000 answers of a few hundred bytes).
const DefaultAnswerCacheBytes = 64 << 20

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
	Listen      string
	Region      string
	DatabaseURL string
	// EffectsDatabaseURL is a database every region sees, where the
	// ledger and receipt-email consumers claim each effect before they
	// produce it (outbox.EffectGuard). Empty: in global store mode the
	// store itself; in region-local mode no guard (each region's inbox
	// dedupes only its own deliveries).
	EffectsDatabaseURL string
	AuthTokens         map[string]string
	// AdminTokens are the admin API's bearer tokens and the names they
	// authenticate (--admin-tokens-file or IDEM_ADMIN_TOKENS; none: the
	// admin API answers 401).
	AdminTokens map[string]string
	// Migrate applies the store's migrations at start (--migrate). With
	// false, the node checks that they have been applied (by idemctl
	// migrate, as a role that owns the schema) and refuses to start
	// otherwise.
	Migrate bool
	// Payments serves the reference payments operation (--payments):
	// POST /payments, GET /payments/{id}, its tables and its outbox
	// workers. Without it the node serves the coordination API and the
	// sidecar's routes only, on a store with the engine's migrations.
	Payments bool
	Window   time.Duration
	LockFor  time.Duration

	EtcdEndpoints  []string
	StoreMode      routing.StoreMode
	RouteToHome    bool
	NodeID         string
	AdvertiseURL   string
	RegionLeaseTTL time.Duration
	// faults are the fault-injection settings, which only builds with
	// -tags failpoints have (faults_on.go).
	faults faults
	// AutoFailoverAfter enables automatic failover (0 = off).
	AutoFailoverAfter time.Duration
	FailoverTargets   map[string]string

	// Operations are the coordination API's declared operations.
	Operations []string
	// ProxyRoutes are the sidecar's proxied routes (--proxy-routes).
	ProxyRoutes []sidecar.Route
	// HTTP bounds the node's HTTP server (timeouts, header size).
	HTTP region.Config

	ProviderURL string
	// ProviderAPIKey is sent to the provider as a bearer token.
	ProviderAPIKey string
	// MetricsToken, if set, is the bearer token /metrics requires.
	MetricsToken    string
	ProviderTimeout time.Duration
	ResponseSchema  string
	ReplayRule      string
	// StoreBodies keeps each payment's 201 answer in its record instead
	// of a reference to the payment (payments.Config.StoreBodies).
	StoreBodies bool
	// AnswerCacheBytes sizes the engine's cache of settled answers
	// (engine.AnswerCache.Bytes); 0 turns it off.
	AnswerCacheBytes int64
	Workers          region.WorkerConfig
	// Outbox configures payments' outbox workers.
	Outbox paymentsnode.Outbox

	// TLSCert and TLSKey make the node serve HTTPS; TLSClientCA is the
	// cluster CA that peers' certificates are verified against.
	TLSCert, TLSKey, TLSClientCA string
	// PeerSecretFile holds the cluster's peer secret (clusters without
	// mTLS).
	PeerSecretFile string
	// ProviderCA verifies the provider's certificate (https provider URL).
	ProviderCA string
	// Etcd holds the etcd client's TLS and authentication flags.
	Etcd etcdclient.Flags
	// Ops holds the logging, tracing and admin listener flags.
	Ops Ops

	ops opsState
	// defaultLogger is the logger ParseFlags may replace from Ops (one set
	// by the embedding program is kept).
	defaultLogger *slog.Logger

	logger     *slog.Logger
	getenv     func(string) string
	store      *store.Store
	effects    *pgxpool.Pool
	server     *region.Server
	etcd       *clientv3.Client
	routes     *routing.Map
	membership *routing.Membership
	stopAuto   context.CancelFunc
	// onFlags, if set, sees the flag set ParseFlags defines, before it
	// parses (a test checks docs/operating.md's Configuration section against it).
	onFlags  func(*flag.FlagSet)
	autoDone chan struct{}
}

// NewMain returns a Main with defaults.
func NewMain() *Main {
	logger := slog.New(telemetry.NewLogHandler(slog.NewTextHandler(os.Stderr, nil)))
	return &Main{logger: logger, defaultLogger: logger}
}

// ParseFlags parses args, falling back to IDEM_* variables read with getenv.
func (m *Main) ParseFlags(args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("idemd", flag.ContinueOnError)
	fs.StringVar(&m.Listen, "listen", region.DefaultAddr, "address to serve HTTP on")
	fs.StringVar(&m.Region, "region", "local", "name of this node's region")
	fs.StringVar(&m.DatabaseURL, "database-url", "", "PostgreSQL or CockroachDB URL of the idempotency store (required)")
	fs.StringVar(&m.EffectsDatabaseURL, "effects-database-url", "", "database every region sees where consumer effects (ledger entries, receipt emails) are claimed once across regions; default: the store in global mode, none in region-local mode")
	tokensFile := fs.String("auth-tokens-file", "", "file of bearer tokens and their tenants, one token=tenant per line (# comments); or IDEM_AUTH_TOKENS=token=tenant,token2=tenant2")
	adminTokensFile := fs.String("admin-tokens-file", "", "file of the admin API's bearer tokens (/v1/admin/records: idemctl records --node) and the operators they name, one token=name per line (# comments); never a tenant's token; or IDEM_ADMIN_TOKENS=token=name,token2=name2; none: the admin API answers 401")
	fs.BoolVar(&m.Migrate, "migrate", true, "apply the store's migrations at start; false: only check that 'idemctl migrate' applied them (the node's role then needs no DDL privilege)")
	fs.BoolVar(&m.Payments, "payments", true, "serve the reference payments operation (POST /payments, GET /payments/{id}, its tables and outbox workers); false: the coordination API and the sidecar's routes only")
	fs.DurationVar(&m.Window, "replay-window", engine.DefaultWindow, "how long a key's record answers retries")
	fs.DurationVar(&m.LockFor, "lock-timeout", engine.DefaultLockFor, "how long an owner holds a key before a retry may take it over")
	fs.StringVar(&m.ProviderURL, "provider-url", "", "base URL of the payment provider; empty: payments complete locally in one transaction")
	metricsTokenFile := fs.String("metrics-token-file", "", "file holding the bearer token GET /metrics requires (Prometheus: authorization.credentials_file); or IDEM_METRICS_TOKEN; empty: /metrics is open")
	providerKeyFile := fs.String("provider-api-key-file", "", "file holding the provider's API key, sent as a bearer token; or IDEM_PROVIDER_API_KEY")
	fs.DurationVar(&m.ProviderTimeout, "provider-timeout", 0, "bound on one provider call (default: lock-timeout/3)")
	fs.StringVar(&m.ResponseSchema, "response-schema", payments.DefaultSchemaVersion, "response schema new payments are answered in: v2 or v3")
	fs.StringVar(&m.ReplayRule, "replay-rule", payments.ReplayAsStored, "what a replay of a response stored under an older schema returns: replay-as-stored or reconstruct-current")
	fs.BoolVar(&m.StoreBodies, "store-response-bodies", false, "store each payment's 201 answer in its record instead of a reference to the payment (set it while nodes older than referencing records share the store)")
	etcd := fs.String("etcd-endpoints", "", "comma-separated etcd endpoints; empty: a single region without a control plane")
	storeMode := fs.String("store-mode", string(routing.RegionLocal), "region-local (each region its own store; requests forwarded home) or global (one store for all regions)")
	fs.BoolVar(&m.RouteToHome, "route-to-home", false, "in global store mode, still forward to the tenant's home region (latency choice)")
	fs.StringVar(&m.NodeID, "node-id", "", "this node's name in its region (default: host-pid)")
	fs.StringVar(&m.AdvertiseURL, "advertise-url", "", "URL other regions forward to (default: http://<listen address>, https:// with --tls-cert)")
	fs.DurationVar(&m.RegionLeaseTTL, "region-lease-ttl", 5*time.Second, "TTL of the node's region liveness lease; the node stops serving home tenants TTL minus a margin after its last successful keepalive")
	fs.DurationVar(&m.AutoFailoverAfter, "auto-failover-after", 0, "move a region's tenants once it has had no live node for this long (0: off; operators run 'idemctl region failover')")
	targets := fs.String("failover-targets", "", "where automatic failover moves each region's tenants: from=to,from2=to2 (default: the elected node's region)")
	fs.Int64Var(&m.AnswerCacheBytes, "answer-cache-bytes", DefaultAnswerCacheBytes, "bytes of settled answers the node keeps in memory to replay retries with no store round trip, each no longer than its record's window and --body-retention (0: off)")
	bodyRetention := fs.Duration("body-retention", 0, "drop stored response bodies this long after creation, once past the window (default: the replay window; never shorter)")
	fs.DurationVar(&m.Workers.Cleanup.MetadataRetention, "metadata-retention", 7*24*time.Hour, "keep expired record metadata this long after the window ends")
	fs.IntVar(&m.Workers.Cleanup.BatchSize, "cleanup-batch", 500, "rows per cleanup statement")
	fs.DurationVar(&m.Workers.Cleanup.Pause, "cleanup-pause", 50*time.Millisecond, "pause between cleanup batches")
	fs.DurationVar(&m.Workers.CleanupInterval, "cleanup-interval", time.Minute, "how often cleanup runs (0 disables)")
	fs.DurationVar(&m.Workers.RecoveryInterval, "recovery-interval", 5*time.Second, "how often stale and unknown payments are reconciled (0 disables)")
	fs.DurationVar(&m.Outbox.Interval, "outbox-interval", 200*time.Millisecond, "how often the outbox is published and consumed (0 disables)")
	fs.DurationVar(&m.Outbox.Retention, "outbox-retention", 7*24*time.Hour, "delete published outbox events, processed deliveries and inbox rows, and sent receipts this long after (0 keeps them)")
	fs.StringVar(&m.TLSCert, "tls-cert", "", "certificate (PEM) to serve HTTPS with; reloaded when the file changes (needs --tls-key)")
	fs.StringVar(&m.TLSKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&m.TLSClientCA, "tls-client-ca", "", "cluster CA (PEM): verifies the client certificates of nodes forwarding requests here and the certificates of nodes this node forwards to; reloaded when it changes")
	fs.StringVar(&m.PeerSecretFile, "peer-secret-file", "", "file holding the cluster's shared peer secret, which authenticates forwarded requests between nodes without mTLS")
	fs.StringVar(&m.ProviderCA, "provider-ca", "", "CA (PEM) that verifies an https --provider-url (default: the system's roots)")
	m.Etcd.Register(fs)
	m.faults.register(fs, &m.Outbox.Duplicate)
	m.Ops.register(fs)
	proxyRoutes := fs.String("proxy-routes", "", "sidecar routes made idempotent and proxied to an upstream service: comma-separated 'METHOD PATH_PREFIX=OPERATION@UPSTREAM_URL[;OPTION]...' with the options lookup=URL, idempotent-upstream, header=NAME, timeout=DURATION, wait=DURATION, ignore=FIELD, key-field=FIELD, replay-header=NAME, pass-authorization, max-response=BYTES and unknown-status=202|503 (docs/sidecar.md); any prefix none of the node's own endpoints lies under or above, /v1/... included")
	operations := fs.String("operations", "", "comma-separated operations the coordination API serves (names of a-z, 0-9, '_', '.', '-'); others are refused with 404 OPERATION_UNKNOWN")
	fs.DurationVar(&m.HTTP.ReadHeaderTimeout, "read-header-timeout", region.DefaultReadHeaderTimeout, "bound on reading a request's headers")
	fs.DurationVar(&m.HTTP.ReadTimeout, "read-timeout", region.DefaultReadTimeout, "bound on reading a request's body (408 REQUEST_TIMEOUT past it)")
	fs.DurationVar(&m.HTTP.WriteTimeout, "write-timeout", region.DefaultWriteTimeout, "bound on a request from its headers to its answer; Prefer: wait=N adds read-timeout + N")
	fs.DurationVar(&m.HTTP.IdleTimeout, "idle-timeout", region.DefaultIdleTimeout, "close keep-alive connections idle this long")
	fs.IntVar(&m.HTTP.MaxHeaderBytes, "max-header-bytes", region.DefaultMaxHeaderBytes, "bound on a request's header block (431 past it)")
	if err := refuseSecretFlags(args); err != nil {
		return err
	}
	if m.onFlags != nil {
		m.onFlags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, getenv); err != nil {
		return err
	}
	if err := m.applyOps(); err != nil {
		return err
	}
	if m.DatabaseURL == "" {
		return fmt.Errorf("--database-url (or %s) is required", cli.EnvName("database-url"))
	}
	for _, op := range strings.Split(*operations, ",") {
		if op = strings.TrimSpace(op); op != "" {
			m.Operations = append(m.Operations, op)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read-header-timeout", m.HTTP.ReadHeaderTimeout}, {"read-timeout", m.HTTP.ReadTimeout}, {"write-timeout", m.HTTP.WriteTimeout}, {"idle-timeout", m.HTTP.IdleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("--%s must be positive", d.name)
		}
	}
	if m.HTTP.MaxHeaderBytes <= 0 {
		return fmt.Errorf("--max-header-bytes must be positive")
	}
	for _, e := range strings.Split(*etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			m.EtcdEndpoints = append(m.EtcdEndpoints, e)
		}
	}
	var err error
	if m.StoreMode, err = routing.ParseStoreMode(*storeMode); err != nil {
		return err
	}
	if m.ProxyRoutes, err = sidecar.ParseRoutes(*proxyRoutes); err != nil {
		return fmt.Errorf("--proxy-routes: %w", err)
	}
	if err := m.faults.parse(getenv); err != nil {
		return err
	}
	if m.NodeID == "" {
		host, _ := os.Hostname()
		m.NodeID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	m.Workers.Cleanup.BodyRetention = *bodyRetention
	if m.Outbox.Retention < 0 {
		return fmt.Errorf("--outbox-retention %v is negative", m.Outbox.Retention)
	}
	if m.Workers.Cleanup.BodyRetention == 0 {
		m.Workers.Cleanup.BodyRetention = m.Window
	}
	if m.AnswerCacheBytes < 0 {
		return fmt.Errorf("--answer-cache-bytes %d is negative", m.AnswerCacheBytes)
	}
	if m.Workers.Cleanup.BodyRetention < m.Window {
		return fmt.Errorf("--body-retention %v is shorter than --replay-window %v: replays inside the window would lose their body", m.Workers.Cleanup.BodyRetention, m.Window)
	}
	if m.FailoverTargets, err = cli.ParsePairs(*targets); err != nil {
		return fmt.Errorf("--failover-targets: %w", err)
	}
	if m.AuthTokens, err = m.loadTokens(*tokensFile, getenv("IDEM_AUTH_TOKENS")); err != nil {
		return err
	}
	if len(m.AuthTokens) == 0 {
		m.logger.Warn("no --auth-tokens-file (or IDEM_AUTH_TOKENS): every authenticated endpoint will answer 401")
	}
	if m.AdminTokens, err = m.loadNamedTokens("--admin-tokens-file", *adminTokensFile, "IDEM_ADMIN_TOKENS", getenv("IDEM_ADMIN_TOKENS")); err != nil {
		return err
	}
	if m.ProviderAPIKey, err = m.loadKey("--provider-api-key-file", *providerKeyFile, "IDEM_PROVIDER_API_KEY", getenv("IDEM_PROVIDER_API_KEY")); err != nil {
		return err
	}
	if m.MetricsToken, err = m.loadKey("--metrics-token-file", *metricsTokenFile, "IDEM_METRICS_TOKEN", getenv("IDEM_METRICS_TOKEN")); err != nil {
		return err
	}
	if (m.TLSCert == "") != (m.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if m.TLSClientCA != "" && m.TLSCert == "" {
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: peers authenticate over HTTPS")
	}
	m.getenv = getenv
	return nil
}

// peerConfig loads the node's TLS and peer authentication settings into
// cfg.
func (m *Main) peerConfig(cfg *region.Config) error {
	if m.TLSCert != "" {
		cert, err := tlsutil.NewReloader(m.TLSCert, m.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert: %w", err)
		}
		var cas *tlsutil.Pool
		if m.TLSClientCA != "" {
			if cas, err = tlsutil.NewPool(m.TLSClientCA); err != nil {
				return fmt.Errorf("--tls-client-ca: %w", err)
			}
			cfg.PeerCAs, cfg.PeerCert = cas, cert
		}
		cfg.TLS = tlsutil.ServerConfig(cert, cas)
	}
	if m.PeerSecretFile != "" {
		b, err := os.ReadFile(m.PeerSecretFile)
		if err != nil {
			return fmt.Errorf("--peer-secret-file: %w", err)
		}
		if cfg.PeerSecret = bytes.TrimSpace(b); len(cfg.PeerSecret) < 16 {
			return fmt.Errorf("--peer-secret-file %s: the secret must be at least 16 bytes", m.PeerSecretFile)
		}
	}
	if len(m.EtcdEndpoints) > 0 && cfg.PeerCAs == nil && len(cfg.PeerSecret) == 0 {
		m.logger.Warn("neither --tls-client-ca nor --peer-secret-file: this node refuses requests forwarded by other nodes and cannot forward to other regions")
	}
	return nil
}

// refuseSecretFlags refuses the flags that used to carry secrets on the
// command line, which every local user can read (/proc/<pid>/cmdline).
func refuseSecretFlags(args []string) error {
	for _, a := range args {
		if a == "--" {
			return nil
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "auth-tokens" {
			return errors.New("--auth-tokens is not accepted: a command line is readable by every local user; put one token=tenant per line in a file only idemd's user can read and pass --auth-tokens-file (or set IDEM_AUTH_TOKENS)")
		}
		if strings.HasPrefix(a, "-") && name == "admin-tokens" {
			return errors.New("--admin-tokens is not accepted: a command line is readable by every local user; put one token=name per line in a file only idemd's user can read and pass --admin-tokens-file (or set IDEM_ADMIN_TOKENS)")
		}
	}
	return nil
}

// loadTokens reads the bearer tokens from the tokens file or, without one,
// from env (IDEM_AUTH_TOKENS).
func (m *Main) loadTokens(file, env string) (map[string]string, error) {
	return m.loadNamedTokens("--auth-tokens-file", file, "IDEM_AUTH_TOKENS", env)
}

// loadNamedTokens reads token=name lines from file (flag names it) or,
// without one, envValue (of envName): the tenants' tokens and the admin
// tokens alike.
func (m *Main) loadNamedTokens(flag, file, envName, envValue string) (map[string]string, error) {
	switch {
	case file != "" && envValue != "":
		return nil, fmt.Errorf("both %s and %s are set; set one", flag, envName)
	case file != "":
		tokens, warn, err := cli.ReadTokensFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if warn != "" {
			m.logger.Warn(warn)
		}
		return tokens, nil
	}
	tokens, err := cli.ParseTokens(envValue)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envName, err)
	}
	return tokens, nil
}

// loadKey reads a key from file (flag names it) or, without one, takes
// envValue (of envName).
func (m *Main) loadKey(flag, file, envName, envValue string) (string, error) {
	key, warn, err := cli.KeyFromFileOrEnv(flag, file, envName, envValue)
	if warn != "" {
		m.logger.Warn(warn)
	}
	return key, err
}

// Run connects to the store, applies migrations (or, with Migrate false,
// checks them), joins the region (with
// etcd) and starts serving. It returns once the node is listening.
func (m *Main) Run(ctx context.Context) error {
	if err := m.startOps(ctx); err != nil {
		return err
	}
	st, err := store.Open(ctx, m.DatabaseURL, store.Options{Logger: m.logger})
	if err != nil {
		return err
	}
	m.store = st
	// Connect now, so that a wrong address, certificate or password stops
	// the node at start with the reason, not at its first request.
	if err := st.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	var sets []store.Migrations // the engine's, and the operations' own
	if m.Payments {
		sets = append(sets, payments.Migrations())
	}
	if m.Migrate {
		if err := st.Migrate(ctx, sets...); err != nil {
			return err
		}
	} else if err := st.CheckMigrated(ctx, sets...); err != nil {
		return err
	}
	if m.Payments {
		if err := m.openEffectGuard(ctx); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", m.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	cfg := payments.Config{
		Region: m.Region, Owner: m.Region + "/" + m.NodeID,
		Window: m.Window, LockFor: m.LockFor, Logger: m.logger,
		ProviderTimeout: m.ProviderTimeout, ResponseSchema: m.ResponseSchema, ReplayRule: m.ReplayRule,
		StoreBodies: m.StoreBodies, Faults: m.faults.payments(),
		OnFenced: func() {
			if m.server != nil {
				m.server.Fenced()
			}
		},
	}
	if err := cfg.Validate(); err != nil {
		_ = ln.Close()
		return err
	}
	if m.ProviderURL != "" {
		pc := &provider.Client{BaseURL: m.ProviderURL, APIKey: m.ProviderAPIKey}
		if m.ProviderCA != "" {
			roots, err := tlsutil.NewPool(m.ProviderCA)
			if err != nil {
				_ = ln.Close()
				return fmt.Errorf("--provider-ca: %w", err)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = tlsutil.ClientConfig(roots, nil)
			pc.HTTP = &http.Client{Transport: tr}
		}
		cfg.Provider = pc
	}
	rcfg := region.Config{Listener: ln, Region: m.Region, NodeID: m.NodeID, Tokens: m.AuthTokens, AdminTokens: m.AdminTokens,
		Logger: m.logger, Registry: m.ops.registry, MetricsToken: m.MetricsToken}
	if m.ops.tracer != nil {
		rcfg.TracerProvider = m.ops.tracer
	}
	if err := m.peerConfig(&rcfg); err != nil {
		_ = ln.Close()
		return err
	}
	var router *routing.Router
	if len(m.EtcdEndpoints) > 0 {
		if router, err = m.joinRegion(ctx, ln, rcfg.TLS != nil); err != nil {
			_ = ln.Close()
			return err
		}
		cfg.Locker = m.membership
	}
	rcfg.Sidecar.Routes = m.ProxyRoutes
	rcfg.Router = router
	rcfg.Operations = m.Operations
	rcfg.ReadHeaderTimeout, rcfg.ReadTimeout = m.HTTP.ReadHeaderTimeout, m.HTTP.ReadTimeout
	rcfg.WriteTimeout, rcfg.IdleTimeout, rcfg.MaxHeaderBytes = m.HTTP.WriteTimeout, m.HTTP.IdleTimeout, m.HTTP.MaxHeaderBytes
	// Settled answers in memory, for every operation of the node's engine.
	answerCache := engine.AnswerCache{Bytes: m.AnswerCacheBytes, Retention: m.Workers.Cleanup.BodyRetention}
	if answerCache.Bytes > 0 {
		if answerCache.Metrics, err = idemprom.NewAnswerCache(m.ops.registry); err != nil {
			_ = ln.Close()
			return err
		}
	}
	// One engine per node, shared by payments, the sidecar's routes, the
	// coordination API and recovery: the payments service's, which fences
	// recovery with the etcd membership's locks, so that the recovery
	// worker and a client's retry exclude each other.
	var ops []region.Operation
	if m.Payments {
		cfg.AnswerCache = answerCache
		pay := payments.NewService(st, cfg)
		rcfg.Engine = pay.Engine()
		ops = append(ops, paymentsnode.Operation(pay, m.Outbox))
	} else {
		eopts := engine.Options{Owner: m.Region + "/" + m.NodeID, HomeRegion: m.Region, Logger: m.logger, AnswerCache: answerCache}
		if m.membership != nil {
			eopts.Locker = m.membership
		}
		rcfg.Engine = engine.New(st, eopts)
	}
	srv, err := region.NewServer(rcfg, st, ops...)
	if err != nil {
		_ = ln.Close()
		return err
	}
	m.server = srv
	if err := srv.Open(); err != nil {
		return err
	}
	srv.StartWorkers(context.WithoutCancel(ctx), m.Workers)
	m.logger.Info("idemd serving", "region", m.Region, "node", m.NodeID, "url", srv.URL(),
		"store_mode", m.StoreMode, "etcd", len(m.EtcdEndpoints) > 0, "replay_window", m.Window)
	return nil
}

// joinRegion connects to etcd, loads the routing map and joins the region
// with a liveness lease.
func (m *Main) joinRegion(ctx context.Context, ln net.Listener, https bool) (*routing.Router, error) {
	getenv := m.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	ecfg, err := m.Etcd.Config(m.EtcdEndpoints, getenv)
	if err != nil {
		return nil, err
	}
	ecfg.DialOptions = append(ecfg.DialOptions, m.ops.etcdDial...)
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	m.etcd = cli
	if m.routes, err = routing.NewMap(ctx, cli, m.logger); err != nil {
		return nil, err
	}
	url := m.AdvertiseURL
	if url == "" {
		url = "http://" + ln.Addr().String()
		if https {
			url = "https://" + ln.Addr().String()
		}
		if host, _, _ := net.SplitHostPort(ln.Addr().String()); net.ParseIP(host).IsUnspecified() {
			return nil, fmt.Errorf("listening on %s, other regions cannot reach %s: set --advertise-url", ln.Addr(), url)
		}
	}
	if m.membership, err = routing.Join(ctx, cli, m.Region, m.NodeID, url, m.RegionLeaseTTL, m.logger); err != nil {
		return nil, err
	}
	if m.AutoFailoverAfter > 0 {
		actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		m.stopAuto, m.autoDone = cancel, make(chan struct{})
		// The election is held as long as a region lease, and regions are
		// looked at twice per --auto-failover-after (at most every second):
		// a dead region is moved about a lease TTL plus
		// --auto-failover-after after its last keepalive.
		af := &routing.AutoFailover{Client: cli, Map: m.routes, Region: m.Region, After: m.AutoFailoverAfter,
			SessionTTL: m.RegionLeaseTTL, Interval: min(time.Second, max(m.AutoFailoverAfter/2, 100*time.Millisecond)),
			Targets: m.FailoverTargets, Logger: m.logger, Now: m.faults.now}
		go func() { defer close(m.autoDone); _ = af.Run(actx) }()
	}
	return routing.NewRouter(cli, m.routes, m.membership, routing.RouterConfig{
		Region: m.Region, Mode: m.StoreMode, RouteToHome: m.RouteToHome, Window: m.Window, Now: m.faults.now,
	}), nil
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
	if m.stopAuto != nil {
		m.stopAuto()
		<-m.autoDone
	}
	if m.membership != nil {
		// Releasing the lease takes this node out of its region at once.
		err = errors.Join(err, m.membership.Close(ctx))
	}
	if m.routes != nil {
		m.routes.Close()
	}
	if m.etcd != nil {
		err = errors.Join(err, m.etcd.Close())
	}
	if m.store != nil {
		m.store.Close()
	}
	if m.effects != nil {
		m.effects.Close()
	}
	return errors.Join(err, m.stopOps(ctx))
}

// openEffectGuard sets m.Outbox.EffectGuard: on EffectsDatabaseURL when
// set, on the store in global store mode, none otherwise.
func (m *Main) openEffectGuard(ctx context.Context) error {
	pool := m.store.Pool()
	switch {
	case m.EffectsDatabaseURL != "":
		p, err := pgxpool.New(ctx, m.EffectsDatabaseURL)
		if err != nil {
			return fmt.Errorf("effects database: %w", err)
		}
		m.effects, pool = p, p
	case m.StoreMode != routing.Global:
		return nil
	}
	g, err := outbox.NewEffectGuard(ctx, pool, m.Region)
	if err != nil {
		return fmt.Errorf("effects database: %w", err)
	}
	m.Outbox.EffectGuard = g
	return nil
}

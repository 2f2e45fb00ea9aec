package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/routing"
)

// Defaults of Config.
const (
	DefaultRegion         = "local"
	DefaultNodesPerRegion = 1
	DefaultReadyTimeout   = 30 * time.Second
	DefaultStopGrace      = 15 * time.Second
	// DefaultRegionLeaseTTL is the nodes' --region-lease-ttl.
	DefaultRegionLeaseTTL = 5 * time.Second
	// StateFile is the name of the file, in the state directory, that
	// Start writes Info to.
	StateFile = "cluster.json"
)

// Store modes (Config.StoreMode), as idemd's --store-mode.
const (
	// StoreRegionLocal gives each region a database of its own
	// (DatabaseName); a tenant's requests are forwarded to its home region.
	StoreRegionLocal = string(routing.RegionLocal)
	// StoreGlobal gives every region one shared database, GlobalDatabase.
	StoreGlobal = string(routing.Global)
	// GlobalDatabase is the database of every region in StoreGlobal mode.
	GlobalDatabase = "idem_global"
)

// BuildCommand builds every binary a cluster runs into ./bin, from the
// module root.
const BuildCommand = "go build -o bin/ ./cmd/... && go build -o bin/etcd go.etcd.io/etcd/server/v3"

// DefaultTenants are the tenants that get a development token when
// Config.Tenants is empty.
func DefaultTenants() []string { return []string{"tenant-a", "tenant-b"} }

const (
	// cleanupTimeout bounds the Stop of a failed Start.
	cleanupTimeout = time.Minute
	// portAttempts bounds how often a process's first start is retried on
	// another port when the one picked was taken meanwhile.
	portAttempts = 5
	// maxRegionLen keeps database names (idem_ + region) well within
	// PostgreSQL's 63-byte identifiers.
	maxRegionLen = 40
)

// SQLSTATEs that createDatabases tolerates.
const (
	codeDuplicateDatabase     = "42P04"
	codeInsufficientPrivilege = "42501"
)

var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// Config configures Start. Only IdemdPath is required. The zero value of
// every other field gives a cluster without etcd or provider, its regions
// independent of each other; "idemctl up" asks for the multi-region cluster
// (EtcdMembers 3, Provider, three regions).
type Config struct {
	// StateDir receives cluster.json, the secrets handed to the processes
	// by file (secrets/: idemd's tokens file, the provider's API and admin
	// keys; mode 0700, removed by Stop), the logs (logs/<name>.log) and, when
	// Start runs them, PostgreSQL's data directory (postgres/), the etcd
	// members' (etcd/m<i>/) and the provider's (provider/). It is created
	// if missing and kept by Stop, so a later Start with the same StateDir
	// reuses the PostgreSQL data and the provider's charges; etcd starts
	// afresh every time (its members get new ports). When the process runs
	// as root, PostgreSQL runs as the "postgres" OS user; if that user
	// cannot search every parent of StateDir (a home directory of mode
	// 0700), PostgreSQL's directory is /var/tmp/idem-pgserver-<hash of its
	// path> instead (see pgserver.DirFor), and postgres/ links to it.
	// Default: a new temporary directory, removed by Stop (PostgreSQL then
	// gets a temporary directory of its own).
	StateDir string

	// Regions names the regions, each of which runs NodesPerRegion nodes
	// and, in region-local store mode, has its own database. Names are
	// lower-case letters, digits, "-" and "_". Default:
	// []string{DefaultRegion}.
	Regions []string

	// NodesPerRegion is how many idemd nodes each region runs.
	// Default DefaultNodesPerRegion.
	NodesPerRegion int

	// IdemdPath is the idemd binary. Required; FindBinary("idemd") finds
	// the usual one.
	IdemdPath string

	// EtcdMembers is how many etcd members (real etcd processes, forming
	// one cluster) to run. With etcd, nodes join their region in etcd
	// (--etcd-endpoints, --node-id <region>-<i>, --region-lease-ttl) and
	// route each tenant to its home region; Start places the tenants
	// round-robin over the regions (the first tenant in the first region,
	// ...). Default 0: no etcd, every region serves every tenant on its
	// own.
	EtcdMembers int

	// EtcdPath is the etcd binary. Default (with EtcdMembers):
	// FindBinary("etcd").
	EtcdPath string

	// ExtraEtcdArgs are appended to every etcd command line (for example
	// --election-timeout). Default: none.
	ExtraEtcdArgs []string

	// Provider runs the payment provider simulator ("idemctl provider",
	// data in <StateDir>/provider) and passes its URL to every node as
	// --provider-url. Default false: payments complete locally.
	Provider bool

	// IdemctlPath is the idemctl binary that runs the provider. Default
	// (with Provider): FindIdemctl().
	IdemctlPath string

	// StoreMode is StoreRegionLocal (the default: a database per region)
	// or StoreGlobal (one database, GlobalDatabase, for every region);
	// it is passed to every node as --store-mode.
	StoreMode string

	// RegionLeaseTTL is the nodes' --region-lease-ttl (with etcd).
	// Default DefaultRegionLeaseTTL.
	RegionLeaseTTL time.Duration

	// Proxied routes every network link of the cluster through its own
	// proxy of an in-process toxiproxy server, so that links can be cut
	// (Partition, Heal) or slowed (AddLatency): each node's links to the
	// store, to each etcd member and to the provider, the link into each
	// node (requests forwarded to it), and the link between every ordered
	// pair of etcd members. See Link. It needs a postgres:// database
	// URL. Default false: processes connect directly.
	Proxied bool

	// DatabaseURL, if set, names an existing PostgreSQL or CockroachDB
	// server to use instead of starting one. Start creates (or reuses) the
	// databases on it; when a single database is needed (one region, or
	// global store mode), if the role may not create databases or
	// DatabaseURL is not a postgres:// URL (a key=value string), that
	// database is DatabaseURL itself. Default: start a throwaway
	// PostgreSQL server (fsync off).
	DatabaseURL string

	// Tenants get one development token each, "dev_" and 32 random hex
	// digits, accepted by every node. Default: DefaultTenants().
	Tenants []string

	// ReplayWindow is passed to every node as --replay-window.
	// Default 0: the node's default.
	ReplayWindow time.Duration

	// ExtraNodeArgs are appended to every idemd command line, so they
	// override the cluster's own flags (for example --lock-timeout or
	// --recovery-interval). Default: none.
	ExtraNodeArgs []string

	// NodeEnv is added to every node's environment (for example
	// IDEM_FAILPOINTS=...), which is otherwise this process's environment
	// without IDEM_* variables, plus IDEM_DATABASE_URL (the database URL
	// may hold a password, and a command line is readable by every local
	// user; every other setting is on the command line). Entries are
	// "KEY=value". Default: none.
	NodeEnv []string

	// ReadyTimeout bounds how long a process may take, from its start, to
	// be ready (a node answers 200 on GET /readyz). Default
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration

	// StopGrace is how long a process may take to exit after SIGTERM
	// before it is killed. Default DefaultStopGrace (idemd itself waits up
	// to 10s for running requests).
	StopGrace time.Duration

	// Logger receives progress messages from the cluster and PostgreSQL.
	// Default: discard.
	Logger *slog.Logger

	// TLS runs the cluster with TLS on every link. Start makes a throwaway
	// CA and certificates (<StateDir>/tls/, keys 0600, made afresh every
	// Start) for every node, etcd member and the provider; etcd requires
	// client certificates from its clients and its members authenticate
	// each other with theirs; nodes serve HTTPS, forward to each other
	// over mutual TLS, each certificate naming its region and node, and
	// verify the provider's certificate. Every URL is https and Info's
	// CAFile names the CA certificate (ClientTLS returns a configuration
	// that trusts it). Default false: plain HTTP, the nodes authenticating
	// forwarded requests with a shared secret (<StateDir>/peer-secret).
	TLS bool
}

// Info describes a running cluster; it is what cluster.json holds.
type Info struct {
	// Regions lists the regions in Config order.
	Regions []RegionInfo `json:"regions"`
	// DatabaseURL is the first region's database.
	DatabaseURL string `json:"databaseUrl"`
	// StoreMode is StoreRegionLocal or StoreGlobal.
	StoreMode string `json:"storeMode"`
	// EtcdEndpoints are the etcd members' client URLs (empty without etcd).
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// ProviderURL is the provider simulator's base URL ("" without it).
	ProviderURL string `json:"providerUrl"`
	// ProviderAdminKey is the key the provider simulator's /admin
	// endpoints (faults, charge counts) require as a bearer token ("" without
	// the simulator).
	ProviderAdminKey string `json:"providerAdminKey"`
	// Tokens maps each tenant to its development bearer token.
	Tokens map[string]string `json:"tokens"`
	// Placements maps each tenant to its home region as Start placed it
	// (empty without etcd, where every region serves every tenant).
	Placements map[string]string `json:"placements"`
	// CAFile is the path of the CA certificate that signs every
	// certificate of a cluster with Config.TLS (omitted without).
	CAFile string `json:"caFile,omitempty"`
}

// RegionInfo describes one region of a running cluster.
type RegionInfo struct {
	Name string `json:"name"`
	// URL is the first node's base URL.
	URL string `json:"url"`
	// Nodes lists every node's base URL, in index order.
	Nodes []string `json:"nodes"`
	// DatabaseURL is the region's database (GlobalDatabase's in global
	// store mode). Nodes of a proxied cluster reach it through their links.
	DatabaseURL string `json:"databaseUrl"`
}

// Cluster is a running local cluster started by Start. Its methods are safe
// for concurrent use. The caller must call Stop, which ends every process
// the cluster started.
type Cluster struct {
	log         *slog.Logger
	stateDir    string
	removeState bool   // stateDir was created by Start
	statePath   string // cluster.json, once written
	storeMode   string
	pg          *pgserver.Server
	net         *network // nil unless Config.Proxied
	regions     []*regionState
	tokens      map[string]string // tenant -> token
	placements  map[string]string // tenant -> home region
	provider    *Process          // nil unless Config.Provider
	tls         *clusterTLS       // nil unless Config.TLS
	peerSecret  string            // the peer secret file, without TLS
	secrets     secretFiles

	mu         sync.Mutex // guards etcd
	etcd       []*Process
	etcdClient *clientv3.Client
	etcdIDs    map[uint64]*Process // member ID -> member

	stopOnce sync.Once
	stopErr  error
}

type regionState struct {
	name  string
	dbURL string
	nodes []*Process
}

// Start starts a cluster and returns once every process is ready (every
// node answers 200 on GET /readyz and, with etcd, routes every tenant to
// its home region) and <StateDir>/cluster.json has been written. PostgreSQL, the etcd members and the provider start
// concurrently; then the tenants are placed (with etcd) and the nodes
// start: the first node of each database alone (it applies the
// migrations), then all the others concurrently. ctx bounds startup only:
// the processes run until Stop. If anything fails (or ctx ends), Start
// stops whatever it had started, leaving no process behind, and returns an
// error; a missing PostgreSQL installation yields an error wrapping
// pgserver.ErrNotInstalled, which names the Debian package.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	began := time.Now()
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cluster{log: cfg.Logger, storeMode: cfg.StoreMode, placements: map[string]string{}}
	ok := false
	defer func() {
		if !ok {
			sctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer cancel()
			if err := c.Stop(sctx); err != nil {
				c.log.Warn("cluster: cleanup after failed start", "err", err)
			}
		}
	}()

	if err := c.prepareStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	var err error
	if c.tokens, err = newTokens(cfg.Tenants); err != nil {
		return nil, err
	}
	if c.secrets, err = writeSecrets(c.stateDir, c.tokens, cfg.Provider); err != nil {
		return nil, err
	}
	if cfg.TLS {
		if c.tls, err = newClusterTLS(c.stateDir); err != nil {
			return nil, err
		}
	} else if c.peerSecret, err = writePeerSecret(c.stateDir); err != nil {
		return nil, err
	}
	if cfg.Proxied {
		c.net = newNetwork(c.log)
	}

	// The store, etcd and the provider do not depend on each other. The
	// first failure cancels the others.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		dbURLs                  map[string]string
		pgErr, etcdErr, provErr error
		wg                      sync.WaitGroup
	)
	failed := func(err error) error {
		if err != nil {
			cancel()
		}
		return err
	}
	wg.Go(func() { dbURLs, pgErr = c.startStore(sctx, &cfg); pgErr = failed(pgErr) })
	if cfg.EtcdMembers > 0 {
		wg.Go(func() {
			etcdErr = c.startEtcd(sctx, &cfg)
			if etcdErr == nil {
				c.placements, etcdErr = c.writePlacements(sctx, cfg.Tenants, cfg.Regions)
			}
			etcdErr = failed(etcdErr)
		})
	}
	if cfg.Provider {
		wg.Go(func() { provErr = failed(c.startProvider(sctx, &cfg)) })
	}
	wg.Wait()
	if err := firstError(ctx, pgErr, etcdErr, provErr); err != nil {
		return nil, err
	}

	env := nodeEnv(cfg.NodeEnv)
	for _, name := range cfg.Regions {
		rs := &regionState{name: name, dbURL: dbURLs[name]}
		for i := range cfg.NodesPerRegion {
			p, err := c.newNode(&cfg, rs, i, env)
			if err != nil {
				return nil, err
			}
			rs.nodes = append(rs.nodes, p)
		}
		c.regions = append(c.regions, rs)
	}
	if err := c.startNodes(ctx); err != nil {
		return nil, err
	}
	if err := c.waitRouting(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}

	statePath := filepath.Join(c.stateDir, StateFile)
	if err := c.WriteState(statePath); err != nil {
		return nil, err
	}
	c.statePath = statePath
	ok = true
	c.log.Info("cluster: ready", "regions", len(c.regions), "nodes", len(c.Nodes()), "etcd_members", len(c.etcd),
		"provider", c.provider != nil, "proxied", c.net != nil, "state", c.stateDir, "elapsed", time.Since(began).Round(time.Millisecond))
	return c, nil
}

// firstError returns the errors of the concurrent startup steps: all of
// them, except those that only say they were cancelled because another
// step failed first.
func firstError(ctx context.Context, errs ...error) error {
	var real []error
	for _, err := range errs {
		if err != nil && (ctx.Err() != nil || !errors.Is(err, context.Canceled)) {
			real = append(real, err)
		}
	}
	if len(real) == 0 {
		return errors.Join(errs...)
	}
	return errors.Join(real...)
}

// startStore starts PostgreSQL (unless cfg.DatabaseURL names a server),
// creates the databases and returns region -> database URL.
func (c *Cluster) startStore(ctx context.Context, cfg *Config) (map[string]string, error) {
	admin := cfg.DatabaseURL
	if admin == "" {
		pgDir := ""
		if !c.removeState {
			var err error
			if pgDir, err = c.postgresDir(); err != nil {
				return nil, err
			}
		}
		pg, err := pgserver.Start(ctx, pgserver.Options{Dir: pgDir, Logger: c.log, TLS: cfg.TLS})
		if err != nil {
			return nil, fmt.Errorf("cluster: start PostgreSQL: %w", err)
		}
		c.pg = pg
		admin = pg.URL()
	}
	dbOf := make(map[string]string, len(cfg.Regions)) // region -> database name
	var names []string
	for _, r := range cfg.Regions {
		name := DatabaseName(r)
		if cfg.StoreMode == StoreGlobal {
			name = GlobalDatabase
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		dbOf[r] = name
	}
	urls, err := createDatabases(ctx, c.log, admin, names)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(dbOf))
	for r, name := range dbOf {
		out[r] = urls[name]
		if c.pg != nil && cfg.TLS {
			// Nodes reach the store over TLS, verifying its certificate.
			out[r] = c.pg.TLSURLFor(name)
		}
	}
	return out, nil
}

// postgresDir returns the directory of the PostgreSQL server of a kept
// state directory: <StateDir>/postgres, or, when the server's OS user cannot
// reach it (running as root in a home directory of mode 0700, say), the
// stable directory pgserver.DirFor gives, which <StateDir>/postgres then
// links to so that it can be found.
func (c *Cluster) postgresDir() (string, error) {
	asked := filepath.Join(c.stateDir, "postgres")
	dir, err := pgserver.DirFor(asked)
	if err != nil {
		return "", fmt.Errorf("cluster: PostgreSQL directory: %w", err)
	}
	if dir == asked {
		return dir, nil
	}
	c.log.Info("cluster: the postgres OS user cannot reach the state directory; PostgreSQL's data is kept elsewhere", "dir", dir, "link", asked)
	if _, err := os.Lstat(asked); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(dir, asked); err != nil {
			return "", fmt.Errorf("cluster: link to PostgreSQL's directory: %w", err)
		}
	}
	return dir, nil
}

// startProvider starts the provider simulator and waits for its /healthz.
func (c *Cluster) startProvider(ctx context.Context, cfg *Config) error {
	dir := filepath.Join(c.stateDir, "provider")
	args := []string{"--data-dir", dir}
	if c.tls != nil {
		cert, key, err := c.tls.issue(KindProvider, nil)
		if err != nil {
			return err
		}
		args = append(args, "--tls-cert", cert, "--tls-key", key)
	}
	p := &Process{
		kind: KindProvider,
		name: KindProvider,
		path: cfg.IdemctlPath,
		argv: func(addr string) []string {
			return append([]string{"provider", "--listen", addr,
				"--api-key-file", c.secrets.providerAPIKey, "--admin-key-file", c.secrets.providerAdminKey}, args...)
		},
		env:          nodeEnv(nil),
		readyPath:    "/healthz",
		logPath:      filepath.Join(c.stateDir, "logs", "provider.log"),
		readyTimeout: cfg.ReadyTimeout,
		stopGrace:    cfg.StopGrace,
		log:          c.log,
		scheme:       c.scheme(),
		tlsConfig:    c.ClientTLS(),
	}
	c.provider = p
	return firstStart(ctx, p)
}

// newNode makes (without starting it) node i of region rs.
func (c *Cluster) newNode(cfg *Config, rs *regionState, i int, env []string) (*Process, error) {
	name := fmt.Sprintf("%s-%d", rs.name, i)
	dbURL := rs.dbURL
	if c.net != nil {
		var err error
		if dbURL, err = c.proxyDatabase(name, dbURL); err != nil {
			return nil, err
		}
	}
	// The database URL may hold a password: it goes in the environment.
	env = append(slices.Clone(env), "IDEM_DATABASE_URL="+dbURL)
	args := []string{
		"--region", rs.name,
		"--auth-tokens-file", c.secrets.tokens,
		"--node-id", name,
		"--store-mode", cfg.StoreMode,
	}
	if c.tls != nil {
		cert, key, err := c.tls.issue(name, &routing.Peer{Region: rs.name, Node: name})
		if err != nil {
			return nil, err
		}
		ca := c.tls.ca.CertFile
		args = append(args, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca,
			"--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", key, "--provider-ca", ca)
	} else {
		args = append(args, "--peer-secret-file", c.peerSecret)
	}
	if cfg.ReplayWindow > 0 {
		args = append(args, "--replay-window", cfg.ReplayWindow.String())
	}
	if etcd := c.EtcdMembers(); len(etcd) > 0 {
		var endpoints []string
		for _, m := range etcd {
			ep := m.URL()
			if c.net != nil {
				l, err := c.net.set(name, m.Name(), m.Addr())
				if err != nil {
					return nil, err
				}
				ep = c.scheme() + "://" + l.Listen
			}
			endpoints = append(endpoints, ep)
		}
		args = append(args, "--etcd-endpoints", strings.Join(endpoints, ","),
			"--region-lease-ttl", cfg.RegionLeaseTTL.String())
	}
	if c.provider != nil {
		u := c.provider.URL()
		if c.net != nil {
			l, err := c.net.set(name, EndpointProvider, c.provider.Addr())
			if err != nil {
				return nil, err
			}
			u = c.scheme() + "://" + l.Listen
		}
		args = append(args, "--provider-url", u, "--provider-api-key-file", c.secrets.providerAPIKey)
	}
	p := &Process{
		kind:         KindNode,
		name:         name,
		region:       rs.name,
		index:        i,
		path:         cfg.IdemdPath,
		env:          env,
		readyPath:    "/readyz",
		logPath:      filepath.Join(c.stateDir, "logs", name+".log"),
		readyTimeout: cfg.ReadyTimeout,
		stopGrace:    cfg.StopGrace,
		log:          c.log,
		scheme:       c.scheme(),
		tlsConfig:    c.ClientTLS(),
	}
	args = append(args, cfg.ExtraNodeArgs...)
	p.argv = func(addr string) []string { return append([]string{"--listen", addr}, args...) }
	if c.net != nil {
		// Forwarded requests reach the node through its ingress link, made
		// once the node's port is known.
		ingress := "->" + name
		p.onAddr = func(addr string) error {
			_, err := c.net.set("", name, addr)
			return err
		}
		p.argv = func(addr string) []string {
			// Before ExtraNodeArgs, which may override it.
			return slices.Concat([]string{"--listen", addr, "--advertise-url", c.scheme() + "://" + c.net.listen(ingress)}, args)
		}
	}
	return p, nil
}

// proxyDatabase creates the link node->store and returns dbURL with the
// link's address as its host.
func (c *Cluster) proxyDatabase(node, dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" || strings.Contains(u.Host, ",") {
		return "", fmt.Errorf("cluster: Proxied needs a postgres://user@host:port/db database URL with one host, not %s", redact(dbURL))
	}
	upstream := u.Host
	if u.Port() == "" {
		upstream = net.JoinHostPort(u.Hostname(), "5432")
	}
	l, err := c.net.set(node, EndpointStore, upstream)
	if err != nil {
		return "", err
	}
	u.Host = l.Listen
	return u.String(), nil
}

// setDefaults fills in defaults and validates cfg.
func (cfg *Config) setDefaults() error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.IdemdPath == "" {
		return errors.New("cluster: Config.IdemdPath is required (see FindBinary)")
	}
	if err := checkExecutable("idemd", cfg.IdemdPath); err != nil {
		return err
	}
	if len(cfg.Regions) == 0 {
		cfg.Regions = []string{DefaultRegion}
	}
	dbs := map[string]string{}
	for _, r := range cfg.Regions {
		if !regionName.MatchString(r) || len(r) > maxRegionLen {
			return fmt.Errorf("cluster: invalid region name %q: want at most %d lower-case letters, digits, '-' and '_', starting with a letter or digit", r, maxRegionLen)
		}
		db := DatabaseName(r)
		if other, dup := dbs[db]; dup {
			return fmt.Errorf("cluster: regions %q and %q would share database %s", other, r, db)
		}
		dbs[db] = r
	}
	switch {
	case cfg.NodesPerRegion == 0:
		cfg.NodesPerRegion = DefaultNodesPerRegion
	case cfg.NodesPerRegion < 0:
		return fmt.Errorf("cluster: NodesPerRegion %d is negative", cfg.NodesPerRegion)
	}
	if len(cfg.Tenants) == 0 {
		cfg.Tenants = DefaultTenants()
	}
	seen := map[string]bool{}
	for _, t := range cfg.Tenants {
		if t == "" || strings.ContainsAny(t, ",= \t\n") || seen[t] {
			return fmt.Errorf("cluster: invalid or duplicate tenant %q", t)
		}
		seen[t] = true
	}
	if cfg.ReplayWindow < 0 {
		return fmt.Errorf("cluster: ReplayWindow %v is negative", cfg.ReplayWindow)
	}
	if cfg.StoreMode == "" {
		cfg.StoreMode = StoreRegionLocal
	}
	if _, err := routing.ParseStoreMode(cfg.StoreMode); err != nil {
		return fmt.Errorf("cluster: StoreMode: %w", err)
	}
	switch {
	case cfg.RegionLeaseTTL == 0:
		cfg.RegionLeaseTTL = DefaultRegionLeaseTTL
	case cfg.RegionLeaseTTL < 0:
		return fmt.Errorf("cluster: RegionLeaseTTL %v is negative", cfg.RegionLeaseTTL)
	}
	if cfg.EtcdMembers < 0 {
		return fmt.Errorf("cluster: EtcdMembers %d is negative", cfg.EtcdMembers)
	}
	if cfg.EtcdMembers > 0 {
		if cfg.EtcdPath == "" {
			p, err := FindBinary("etcd")
			if err != nil {
				return err
			}
			cfg.EtcdPath = p
		}
		if err := checkExecutable("etcd", cfg.EtcdPath); err != nil {
			return err
		}
	}
	if cfg.Provider {
		if cfg.IdemctlPath == "" {
			p, err := FindIdemctl()
			if err != nil {
				return err
			}
			cfg.IdemctlPath = p
		}
		if err := checkExecutable("idemctl", cfg.IdemctlPath); err != nil {
			return err
		}
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	return nil
}

// checkExecutable checks that path is an executable file.
func checkExecutable(what, path string) error {
	if fi, err := os.Stat(path); err != nil {
		return fmt.Errorf("cluster: %s binary: %w", what, err)
	} else if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("cluster: %s binary %s is not an executable file", what, path)
	}
	return nil
}

// DatabaseName returns the database of a region in region-local store
// mode: idem_ followed by the region name with "-" replaced by "_".
func DatabaseName(region string) string {
	return "idem_" + strings.ReplaceAll(region, "-", "_")
}

// prepareStateDir creates the state directory (or a temporary one) and its
// logs directory, and removes a cluster.json left by an earlier run.
func (c *Cluster) prepareStateDir(dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "idem-cluster-")
		if err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		c.stateDir, c.removeState = d, true
	} else {
		d, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		c.stateDir = d
		// A stale cluster.json would announce endpoints that are gone.
		if err := os.Remove(filepath.Join(d, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cluster: remove stale %s: %w", StateFile, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(c.stateDir, "logs"), 0o755); err != nil {
		return fmt.Errorf("cluster: logs directory: %w", err)
	}
	return nil
}

// newTokens makes one development token per tenant.
func newTokens(tenants []string) (map[string]string, error) {
	tokens := make(map[string]string, len(tenants))
	for _, t := range tenants {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("cluster: token: %w", err)
		}
		tokens[t] = "dev_" + hex.EncodeToString(b[:])
	}
	return tokens, nil
}

// secretFiles are the files, in <StateDir>/secrets, that hand the
// cluster's secrets to its processes: secrets are never put on a command
// line, which every local user can read.
type secretFiles struct {
	tokens           string // idemd's --auth-tokens-file
	providerAPIKey   string // "" without the provider
	providerAdminKey string
	adminKey         string // the admin key itself, for Info
}

// writeSecrets writes the tokens file and, with the provider, its API and
// admin keys (new random ones) into dir/secrets, a directory only the
// owner may enter, each file with mode 0600.
func writeSecrets(dir string, tokens map[string]string, withProvider bool) (secretFiles, error) {
	sd := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(sd, 0o700); err != nil {
		return secretFiles{}, fmt.Errorf("cluster: secrets directory: %w", err)
	}
	if err := os.Chmod(sd, 0o700); err != nil {
		return secretFiles{}, fmt.Errorf("cluster: secrets directory: %w", err)
	}
	var b strings.Builder
	b.WriteString("# idemd bearer tokens (--auth-tokens-file): one token=tenant per line\n")
	for _, tenant := range slices.Sorted(maps.Keys(tokens)) {
		b.WriteString(tokens[tenant] + "=" + tenant + "\n")
	}
	sf := secretFiles{tokens: filepath.Join(sd, "auth-tokens")}
	if err := writeFileAtomic(sf.tokens, []byte(b.String())); err != nil {
		return secretFiles{}, err
	}
	if !withProvider {
		return sf, nil
	}
	keys := make([]string, 2)
	for i := range keys {
		var r [24]byte
		if _, err := rand.Read(r[:]); err != nil {
			return secretFiles{}, fmt.Errorf("cluster: provider key: %w", err)
		}
		keys[i] = hex.EncodeToString(r[:])
	}
	sf.providerAPIKey = filepath.Join(sd, "provider-api-key")
	sf.providerAdminKey = filepath.Join(sd, "provider-admin-key")
	sf.adminKey = "adm_" + keys[1]
	if err := writeFileAtomic(sf.providerAPIKey, []byte("api_"+keys[0]+"\n")); err != nil {
		return secretFiles{}, err
	}
	if err := writeFileAtomic(sf.providerAdminKey, []byte(sf.adminKey+"\n")); err != nil {
		return secretFiles{}, err
	}
	return sf, nil
}

// nodeEnv is this process's environment without IDEM_* variables, plus
// extra.
func nodeEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// createDatabases creates the databases named on the server at admin and
// returns name -> database URL. A database that exists already is reused.
// When a single database is needed and admin is not a postgres:// URL, or
// its role may not create databases, that database is admin itself.
func createDatabases(ctx context.Context, log *slog.Logger, admin string, names []string) (map[string]string, error) {
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		if len(names) == 1 {
			log.Warn("cluster: database is not a postgres:// URL; it is used as it is", "database", names[0])
			return map[string]string{names[0]: admin}, nil
		}
		return nil, fmt.Errorf("cluster: database URL %s: want postgres://user@host:port/db to create a database per region", redact(admin))
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect to %s: %w", redact(admin), err)
	}
	defer conn.Close(context.Background())
	urls := make(map[string]string, len(names))
	for _, name := range names {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			log.Info("cluster: created database", "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeDuplicateDatabase:
			log.Info("cluster: reusing database", "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege && len(names) == 1:
			log.Warn("cluster: may not create databases; using the given database", "instead_of", name, "err", err)
			urls[name] = admin
			continue
		default:
			return nil, fmt.Errorf("cluster: create database %s: %w", name, err)
		}
		du := *u
		du.Path, du.RawPath = "/"+name, ""
		urls[name] = du.String()
	}
	return urls, nil
}

// redact hides the password of a URL for error messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// startNodes starts the first node of each database (concurrently), which
// applies the migrations, then every other node concurrently, and returns
// once all are ready. Concurrent first-time migrations of one database can
// fail in PostgreSQL's catalog ("type ... already exists").
func (c *Cluster) startNodes(ctx context.Context) error {
	var first, rest []*Process
	seen := map[string]bool{}
	for _, rs := range c.regions {
		for _, p := range rs.nodes {
			if seen[rs.dbURL] {
				rest = append(rest, p)
			} else {
				seen[rs.dbURL] = true
				first = append(first, p)
			}
		}
	}
	for _, batch := range [][]*Process{first, rest} {
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, p := range batch {
			wg.Go(func() { errs[i] = firstStart(ctx, p) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// routingProbe is the payment id that waitRouting asks for: one that does
// not exist.
const routingProbe = "idem-cluster-routing-probe"

// waitRouting waits until every node routes every placed tenant: GET
// /payments/<routingProbe> with the tenant's token is answered by the
// tenant's home region (404), not refused because the node has not yet
// seen the nodes of that region (a node learns of the others through an
// etcd watch, which may lag a little behind their readiness).
func (c *Cluster) waitRouting(ctx context.Context, timeout time.Duration) error {
	if len(c.placements) == 0 {
		return nil
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: c.ClientTLS()}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: probeTimeout}
	tenants := slices.Sorted(maps.Keys(c.placements))
	nodes := c.Nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, p := range nodes {
		wg.Go(func() {
			for _, t := range tenants {
				if errs[i] = waitRouted(ctx, client, p, t, c.tokens[t], c.placements[t]); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	c.log.Debug("cluster: every node routes every tenant", "elapsed", time.Since(began).Round(time.Millisecond))
	return errors.Join(errs...)
}

// waitRouted polls node p until a tenant's request is routed.
func waitRouted(ctx context.Context, client *http.Client, p *Process, tenant, token, home string) error {
	url := p.URL() + "/payments/" + routingProbe
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			if resp.StatusCode < 500 && resp.StatusCode != http.StatusMisdirectedRequest {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: node %s does not route %s's requests to its home region %s: %w (last answer: %s)",
				p.Name(), tenant, home, ctx.Err(), last)
		case <-time.After(readyPoll):
		}
	}
}

// firstStart starts a node or the provider on a free port and waits until
// it is ready, moving to another port if the one picked was taken
// meanwhile.
func firstStart(ctx context.Context, p *Process) error {
	for attempt := 1; ; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		p.setAddr(addr)
		if p.onAddr != nil {
			if err := p.onAddr(addr); err != nil {
				return err
			}
		}
		if err := p.start(); err != nil {
			return err
		}
		err = p.WaitReady(ctx)
		if err == nil {
			p.log.Info("cluster: "+p.kind+" ready", "name", p.Name(), "url", p.URL(), "pid", p.Pid())
			return nil
		}
		_ = p.Kill()
		if !errors.Is(err, errAddrInUse) || attempt == portAttempts || ctx.Err() != nil {
			return err
		}
		p.log.Info("cluster: port taken, retrying", "name", p.Name(), "addr", addr)
	}
}

// Info returns the cluster's endpoints, databases, tokens and placements.
// The result is a copy the caller may keep.
func (c *Cluster) Info() Info {
	info := Info{
		StoreMode:     c.storeMode,
		EtcdEndpoints: c.EtcdEndpoints(),
		ProviderURL:   c.ProviderURL(),
		Tokens:        maps.Clone(c.tokens),
		Placements:    maps.Clone(c.placements),
		CAFile:        c.CAFile(),
	}
	if c.provider != nil {
		info.ProviderAdminKey = c.secrets.adminKey
	}
	if info.Tokens == nil {
		info.Tokens = map[string]string{}
	}
	if info.Placements == nil {
		info.Placements = map[string]string{}
	}
	for _, r := range c.regions {
		ri := RegionInfo{Name: r.name, DatabaseURL: r.dbURL, Nodes: []string{}}
		for _, p := range r.nodes {
			ri.Nodes = append(ri.Nodes, p.URL())
		}
		if len(ri.Nodes) > 0 {
			ri.URL = ri.Nodes[0]
		}
		info.Regions = append(info.Regions, ri)
	}
	if len(c.regions) > 0 {
		info.DatabaseURL = c.regions[0].dbURL
	}
	return info
}

// WriteState writes Info as indented JSON to path atomically: to a
// temporary file in the same directory, then renamed over path. The file
// has mode 0600, as it holds bearer tokens.
func (c *Cluster) WriteState(path string) error {
	b, err := json.MarshalIndent(c.Info(), "", "  ")
	if err != nil {
		return fmt.Errorf("cluster: write state: %w", err)
	}
	b = append(b, '\n')
	return writeFileAtomic(path, b)
}

// writeFileAtomic writes b to path atomically: to a temporary file in the
// same directory, with mode 0600, then renamed over path.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cluster: write %s: %w", filepath.Base(path), err)
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("cluster: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// StateDir returns the absolute path of the state directory.
func (c *Cluster) StateDir() string { return c.stateDir }

// StatePath returns the path of the cluster.json that Start wrote.
func (c *Cluster) StatePath() string { return filepath.Join(c.stateDir, StateFile) }

// Node returns node i (from 0) of region, or nil if there is no such node.
func (c *Cluster) Node(region string, i int) *Process {
	for _, r := range c.regions {
		if r.name == region && i >= 0 && i < len(r.nodes) {
			return r.nodes[i]
		}
	}
	return nil
}

// Nodes returns every node, region by region in Config order.
func (c *Cluster) Nodes() []*Process {
	var out []*Process
	for _, r := range c.regions {
		out = append(out, r.nodes...)
	}
	return out
}

// Provider returns the provider simulator's process, or nil without
// Config.Provider.
func (c *Cluster) Provider() *Process { return c.provider }

// ProviderAdminKey returns the key the provider simulator's /admin
// endpoints require (provider.Client.AdminKey), or "" without
// Config.Provider.
func (c *Cluster) ProviderAdminKey() string {
	if c.provider == nil {
		return ""
	}
	return c.secrets.adminKey
}

// ProviderURL returns the provider simulator's base URL, as the cluster
// itself reaches it, or "" without Config.Provider.
func (c *Cluster) ProviderURL() string {
	if c.provider == nil {
		return ""
	}
	return c.provider.URL()
}

// HomeRegion returns the region Start placed tenant in ("" without etcd,
// or for an unknown tenant). Placements may move later (package routing);
// this is the initial one.
func (c *Cluster) HomeRegion(tenant string) string { return c.placements[tenant] }

// StoreMode returns StoreRegionLocal or StoreGlobal.
func (c *Cluster) StoreMode() string { return c.storeMode }

// PostgresPid returns the process id of the PostgreSQL server the cluster
// started, or 0 if it uses Config.DatabaseURL.
func (c *Cluster) PostgresPid() int {
	if c.pg == nil {
		return 0
	}
	return c.pg.Pid()
}

// Stop stops the cluster and returns once every process has been reaped:
// it heals every link (so that nodes can leave etcd promptly), stops every
// node concurrently (SIGTERM, then SIGKILL after the stop grace period or
// once ctx ends), then the provider, the etcd members and the PostgreSQL
// server it started, and finally the proxies. It then removes
// cluster.json and secrets/, and the state directory if Start created it. Stop is
// idempotent: later calls wait for the first and return its result. The
// error joins every problem met (a process that had to be killed, or
// exited with a non-zero status on SIGTERM); the processes are gone
// regardless.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { c.stopErr = c.stop(ctx) })
	return c.stopErr
}

func (c *Cluster) stop(ctx context.Context) error {
	began := time.Now()
	var errs []error
	if c.net != nil {
		if err := c.net.heal(c.net.allNames()); err != nil {
			c.log.Warn("cluster: stop: heal links", "err", err)
		}
		_ = c.net.removeToxics(c.net.allNames())
	}
	stopAll := func(procs []*Process) {
		if len(procs) == 0 {
			return
		}
		phase := time.Now()
		perr := make([]error, len(procs))
		var wg sync.WaitGroup
		for i, p := range procs {
			p.close()
			wg.Go(func() { perr[i] = p.Stop(ctx) })
		}
		wg.Wait()
		errs = append(errs, perr...)
		c.log.Debug("cluster: stopped "+procs[0].kind+"s", "count", len(procs), "elapsed", time.Since(phase).Round(time.Millisecond))
	}
	nodes := c.Nodes()
	stopAll(nodes)
	if c.provider != nil {
		stopAll([]*Process{c.provider})
	}
	// The etcd followers stop first: a leader stopping while they are
	// still connected hands its leadership over to one of them, which
	// waits up to etcd's request timeout (7s) if that one is stopping too.
	etcd := c.EtcdMembers()
	if c.etcdClient != nil {
		lctx, cancel := context.WithTimeout(ctx, etcdStatusTimeout)
		leader, err := c.EtcdLeader(lctx)
		cancel()
		_ = c.etcdClient.Close()
		if err == nil {
			var followers []*Process
			for _, p := range etcd {
				if p != leader {
					followers = append(followers, p)
				}
			}
			stopAll(followers)
			leader.waitNoActivePeers(ctx, etcdQuietTimeout)
			stopAll([]*Process{leader})
		}
	}
	stopAll(etcd) // all of them, if there was no leader; else a no-op
	if c.pg != nil {
		if err := c.pg.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: stop PostgreSQL: %w", err))
		}
	}
	if c.net != nil {
		c.net.close()
	}
	if c.statePath != "" {
		if err := os.Remove(c.statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if c.secrets.tokens != "" {
		if err := os.RemoveAll(filepath.Dir(c.secrets.tokens)); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if c.removeState && c.stateDir != "" {
		if err := os.RemoveAll(c.stateDir); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if len(nodes) > 0 || len(etcd) > 0 || c.provider != nil || c.pg != nil {
		c.log.Info("cluster: stopped", "elapsed", time.Since(began).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// FindBinary returns the path of the executable name (such as "idemd"):
// next to the running executable (os.Executable, symlinks resolved), then
// in ./bin, then on PATH. The error says how to build it.
func FindBinary(name string) (string, error) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		dirs = append(dirs, filepath.Dir(exe))
	}
	dirs = append(dirs, "bin")
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return filepath.Abs(p)
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("cluster: %s binary not found next to this executable, in ./bin or on PATH; from the module root, build the binaries and run with `%s && bin/idemctl up`, or pass its path: %w", name, BuildCommand, exec.ErrNotFound)
}

// FindIdemctl returns the idemctl binary, which runs the provider
// simulator: the running executable if it is idemctl, else
// FindBinary("idemctl").
func FindIdemctl() (string, error) {
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "idemctl" {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		return exe, nil
	}
	return FindBinary("idemctl")
}

package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem/internal/pgserver"
)

// Defaults of Config.
const (
	DefaultRegion         = "local"
	DefaultNodesPerRegion = 1
	DefaultReadyTimeout   = 30 * time.Second
	DefaultStopGrace      = 15 * time.Second
	// StateFile is the name of the file, in the state directory, that
	// Start writes Info to.
	StateFile = "cluster.json"
)

// DefaultTenants are the tenants that get a development token when
// Config.Tenants is empty.
func DefaultTenants() []string { return []string{"tenant-a", "tenant-b"} }

const (
	// cleanupTimeout bounds the Stop of a failed Start.
	cleanupTimeout = time.Minute
	// portAttempts bounds how often a node's first start is retried on
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

// Config configures Start. Only IdemdPath is required.
type Config struct {
	// StateDir receives cluster.json, the node logs (logs/<region>-<i>.log)
	// and, when Start runs PostgreSQL, its data directory (postgres/). It is
	// created if missing and kept by Stop, so a later Start with the same
	// StateDir reuses the PostgreSQL data. When the process runs as root,
	// PostgreSQL runs as the "postgres" OS user, which must be able to
	// search every parent of StateDir.
	// Default: a new temporary directory, removed by Stop (PostgreSQL then
	// gets a temporary directory of its own).
	StateDir string

	// Regions names the regions, each of which gets its own database and
	// NodesPerRegion nodes. Names are lower-case letters, digits, "-" and
	// "_". Default: []string{DefaultRegion}.
	Regions []string

	// NodesPerRegion is how many idemd nodes each region runs.
	// Default DefaultNodesPerRegion.
	NodesPerRegion int

	// IdemdPath is the idemd binary. Required; FindBinary("idemd") finds
	// the usual one.
	IdemdPath string

	// DatabaseURL, if set, names an existing PostgreSQL or CockroachDB
	// server to use instead of starting one. Start creates (or reuses) the
	// region databases on it; with a single region, if the role may not
	// create databases or DatabaseURL is not a postgres:// URL (a
	// key=value string), the region uses DatabaseURL itself. Default: start a throwaway PostgreSQL
	// server (fsync off).
	DatabaseURL string

	// Tenants get one development token each, "dev_" and 32 random hex
	// digits, accepted by every node. Default: DefaultTenants().
	Tenants []string

	// ReplayWindow is passed to every node as --replay-window.
	// Default 0: the node's default.
	ReplayWindow time.Duration

	// ExtraNodeArgs are appended to every idemd command line, for example
	// flags of features the cluster does not know about. Default: none.
	ExtraNodeArgs []string

	// NodeEnv is added to every node's environment, which is otherwise
	// this process's environment without IDEM_* variables (nodes are
	// configured by their command line only). Entries are "KEY=value".
	// Default: none.
	NodeEnv []string

	// ReadyTimeout bounds how long a node may take, from its start, to
	// answer 200 on GET /readyz. Default DefaultReadyTimeout.
	ReadyTimeout time.Duration

	// StopGrace is how long a node may take to exit after SIGTERM before
	// it is killed. Default DefaultStopGrace (idemd itself waits up to 10s
	// for running requests).
	StopGrace time.Duration

	// Logger receives progress messages from the cluster and PostgreSQL.
	// Default: discard.
	Logger *slog.Logger
}

// Info describes a running cluster; it is what cluster.json holds.
type Info struct {
	// Regions lists the regions in Config order.
	Regions []RegionInfo `json:"regions"`
	// DatabaseURL is the first region's database.
	DatabaseURL string `json:"databaseUrl"`
	// Tokens maps each tenant to its development bearer token.
	Tokens map[string]string `json:"tokens"`
}

// RegionInfo describes one region of a running cluster.
type RegionInfo struct {
	Name string `json:"name"`
	// URL is the first node's base URL.
	URL string `json:"url"`
	// Nodes lists every node's base URL, in index order.
	Nodes []string `json:"nodes"`
	// DatabaseURL is the region's own database.
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
	pg          *pgserver.Server
	regions     []*regionState
	tokens      map[string]string // tenant -> token

	stopOnce sync.Once
	stopErr  error
}

type regionState struct {
	name  string
	dbURL string
	nodes []*Process
}

// Start starts a cluster and returns once every node answers 200 on
// GET /readyz and <StateDir>/cluster.json has been written. Regions start
// concurrently; within a region the first node starts (and applies the
// migrations) before the others. ctx bounds
// startup only: the processes run until Stop. If anything fails (or ctx
// ends), Start stops whatever it had started, leaving no process behind,
// and returns an error; a missing PostgreSQL installation yields an error
// wrapping pgserver.ErrNotInstalled, which names the Debian package.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	began := time.Now()
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cluster{log: cfg.Logger}
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

	admin := cfg.DatabaseURL
	if admin == "" {
		pgDir := ""
		if !c.removeState {
			pgDir = filepath.Join(c.stateDir, "postgres")
		}
		c.pg, err = pgserver.Start(ctx, pgserver.Options{Dir: pgDir, Logger: c.log})
		if err != nil {
			return nil, fmt.Errorf("cluster: start PostgreSQL: %w", err)
		}
		admin = c.pg.URL()
	}
	dbURLs, err := createDatabases(ctx, c.log, admin, cfg.Regions)
	if err != nil {
		return nil, err
	}

	env := nodeEnv(cfg.NodeEnv)
	tokenArg := tokensArg(c.tokens)
	for _, name := range cfg.Regions {
		rs := &regionState{name: name, dbURL: dbURLs[name]}
		for i := range cfg.NodesPerRegion {
			args := []string{"--region", name, "--database-url", rs.dbURL, "--auth-tokens", tokenArg}
			if cfg.ReplayWindow > 0 {
				args = append(args, "--replay-window", cfg.ReplayWindow.String())
			}
			args = append(args, cfg.ExtraNodeArgs...)
			rs.nodes = append(rs.nodes, &Process{
				region:       name,
				index:        i,
				path:         cfg.IdemdPath,
				args:         args,
				env:          env,
				logPath:      filepath.Join(c.stateDir, "logs", fmt.Sprintf("%s-%d.log", name, i)),
				readyTimeout: cfg.ReadyTimeout,
				stopGrace:    cfg.StopGrace,
				log:          c.log,
			})
		}
		c.regions = append(c.regions, rs)
	}

	// Regions start concurrently. Within a region the first node starts
	// alone, so that it applies the migrations before the others connect:
	// concurrent first-time migrations of one database can fail in
	// PostgreSQL's catalog ("type ... already exists").
	errs := make([]error, len(c.regions))
	var wg sync.WaitGroup
	for i, rs := range c.regions {
		wg.Go(func() { errs[i] = startRegion(ctx, rs.nodes) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	nodes := c.Nodes()

	statePath := filepath.Join(c.stateDir, StateFile)
	if err := c.WriteState(statePath); err != nil {
		return nil, err
	}
	c.statePath = statePath
	ok = true
	c.log.Info("cluster: ready", "regions", len(c.regions), "nodes", len(nodes),
		"state", c.stateDir, "elapsed", time.Since(began).Round(time.Millisecond))
	return c, nil
}

// setDefaults fills in defaults and validates cfg.
func (cfg *Config) setDefaults() error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.IdemdPath == "" {
		return errors.New("cluster: Config.IdemdPath is required (see FindBinary)")
	}
	if fi, err := os.Stat(cfg.IdemdPath); err != nil {
		return fmt.Errorf("cluster: idemd binary: %w", err)
	} else if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("cluster: idemd binary %s is not an executable file", cfg.IdemdPath)
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
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
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

// tokensArg formats tokens as idemd's --auth-tokens: token=tenant,...
func tokensArg(tokens map[string]string) string {
	pairs := make([]string, 0, len(tokens))
	for tenant, token := range tokens {
		pairs = append(pairs, token+"="+tenant)
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
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

// createDatabases creates each region's database on the server at admin
// and returns region -> database URL. A database that exists already is
// reused. If the role may not create databases and there is a single
// region, that region uses admin itself.
func createDatabases(ctx context.Context, log *slog.Logger, admin string, regions []string) (map[string]string, error) {
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		if len(regions) == 1 {
			log.Warn("cluster: database is not a postgres:// URL; the region uses it as it is", "region", regions[0])
			return map[string]string{regions[0]: admin}, nil
		}
		return nil, fmt.Errorf("cluster: database URL %s: want postgres://user@host:port/db to create a database per region", redact(admin))
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect to %s: %w", redact(admin), err)
	}
	defer conn.Close(context.Background())
	urls := make(map[string]string, len(regions))
	for _, r := range regions {
		name := DatabaseName(r)
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			log.Info("cluster: created database", "region", r, "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeDuplicateDatabase:
			log.Info("cluster: reusing database", "region", r, "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege && len(regions) == 1:
			log.Warn("cluster: may not create databases; the region uses the given database", "region", r, "err", err)
			urls[r] = admin
			continue
		default:
			return nil, fmt.Errorf("cluster: create database %s for region %s: %w", name, r, err)
		}
		du := *u
		du.Path, du.RawPath = "/"+name, ""
		urls[r] = du.String()
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

// startRegion starts nodes[0], then the other nodes concurrently, and
// returns once all are ready.
func startRegion(ctx context.Context, nodes []*Process) error {
	if len(nodes) == 0 {
		return nil
	}
	if err := firstStart(ctx, nodes[0]); err != nil {
		return err
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, p := range nodes[1:] {
		wg.Go(func() { errs[i] = firstStart(ctx, p) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// firstStart starts a node on a free port and waits until it is ready,
// moving to another port if the one picked was taken meanwhile.
func firstStart(ctx context.Context, p *Process) error {
	for attempt := 1; ; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		p.setAddr(addr)
		if err := p.start(); err != nil {
			return err
		}
		err = p.WaitReady(ctx)
		if err == nil {
			p.log.Info("cluster: node ready", "node", p.Name(), "url", p.URL(), "pid", p.Pid())
			return nil
		}
		_ = p.Kill()
		if !errors.Is(err, errAddrInUse) || attempt == portAttempts || ctx.Err() != nil {
			return err
		}
		p.log.Info("cluster: port taken, retrying", "node", p.Name(), "addr", addr)
	}
}

// Info returns the cluster's endpoints, databases and tokens. The result is
// a copy the caller may keep.
func (c *Cluster) Info() Info {
	info := Info{Tokens: make(map[string]string, len(c.tokens))}
	for t, tok := range c.tokens {
		info.Tokens[t] = tok
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
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cluster: write state: %w", err)
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
		return fmt.Errorf("cluster: write state: %w", err)
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

// PostgresPid returns the process id of the PostgreSQL server the cluster
// started, or 0 if it uses Config.DatabaseURL.
func (c *Cluster) PostgresPid() int {
	if c.pg == nil {
		return 0
	}
	return c.pg.Pid()
}

// Stop stops every node concurrently (SIGTERM, then SIGKILL after the stop
// grace period or once ctx ends), then the PostgreSQL server it started,
// and returns once all of them have been reaped. It then removes
// cluster.json, and the state directory if Start created it. Stop is
// idempotent: later calls wait for the first and return its result. The
// error joins every problem met (a node that had to be killed, or exited
// with a non-zero status on SIGTERM); the processes are gone regardless.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { c.stopErr = c.stop(ctx) })
	return c.stopErr
}

func (c *Cluster) stop(ctx context.Context) error {
	began := time.Now()
	nodes := c.Nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, p := range nodes {
		p.close()
		wg.Go(func() { errs[i] = p.Stop(ctx) })
	}
	wg.Wait()
	if c.pg != nil {
		if err := c.pg.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: stop PostgreSQL: %w", err))
		}
	}
	if c.statePath != "" {
		if err := os.Remove(c.statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if c.removeState && c.stateDir != "" {
		if err := os.RemoveAll(c.stateDir); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if len(nodes) > 0 || c.pg != nil {
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
	return "", fmt.Errorf("cluster: %s binary not found next to this executable, in ./bin or on PATH; build it with `go build -o bin/ ./cmd/...` (from the module root) or pass its path: %w", name, exec.ErrNotFound)
}

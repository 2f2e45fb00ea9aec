package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/pgbouncer"
	"github.com/idemcoord/idem/internal/pgha"
	"github.com/idemcoord/idem/internal/pgserver"
)

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

// Cluster is a running local cluster started by Start. Its methods are safe
// for concurrent use. The caller must call Stop, which ends every process
// the cluster started.
type Cluster struct {
	log         *slog.Logger
	stateDir    string
	removeState bool   // stateDir was created by Start
	statePath   string // cluster.json, once written
	storeMode   string
	operations  []string // Config.Operations
	pg          *pgserver.Server
	bouncer     *pgbouncer.Server // nil unless Config.PgBouncer
	store       *pgha.Cluster     // nil unless Config.StoreHA
	effectsURL  string            // EffectsDatabase's URL; "" unless region-local with several regions
	haDatabase  string            // the database of the replicated store (Config.StoreHA)
	net         *network          // nil unless Config.Proxied
	storeLinks  bool              // Config.ProxiedStoreOnly: net carries the replicated store's links alone
	regions     []*regionState
	tokens      map[string]string // tenant -> token
	placements  map[string]string // tenant -> home region
	provider    *Process          // nil unless Config.Provider
	tls         *clusterTLS       // nil unless Config.TLS
	docker      *dockerEnv        // nil unless Config.Docker
	dockerStore *Process          // PostgreSQL's container with Config.Docker
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
	c := &Cluster{log: cfg.Logger, storeMode: cfg.StoreMode, operations: slices.Clone(cfg.Operations), placements: map[string]string{}}
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
	if c.tokens, err = newTokens(slices.Concat(cfg.Tenants, cfg.UnplacedTenants)); err != nil {
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
	if cfg.Docker {
		if err := c.startDocker(ctx, &cfg); err != nil {
			return nil, err
		}
	} else if cfg.Proxied {
		c.net = newNetwork(c.log)
		c.storeLinks = cfg.ProxiedStoreOnly
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
	// In global mode the replicated store is the store; in region-local
	// mode the regions' stores are PostgreSQL's and the replicated store
	// holds the effects database.
	if !cfg.StoreHA || cfg.StoreMode != StoreGlobal {
		wg.Go(func() {
			dbURLs, pgErr = c.startStore(sctx, &cfg)
			if pgErr == nil && cfg.PgBouncer {
				dbURLs, pgErr = c.startPgBouncer(sctx, dbURLs)
			}
			pgErr = failed(pgErr)
		})
	}
	var haErr error
	if cfg.EtcdMembers > 0 {
		wg.Go(func() {
			etcdErr = c.startEtcd(sctx, &cfg)
			if etcdErr == nil {
				c.placements, etcdErr = c.writePlacements(sctx, cfg.Tenants, cfg.Regions)
			}
			if etcdErr == nil && cfg.StoreHA {
				// The replicated store keeps its leader key in etcd.
				urls, err := c.startStoreHA(sctx, &cfg)
				if cfg.StoreMode == StoreGlobal {
					dbURLs = urls
				}
				haErr = failed(err)
			}
			etcdErr = failed(etcdErr)
		})
	}
	if cfg.Provider {
		wg.Go(func() { provErr = failed(c.startProvider(sctx, &cfg)) })
	}
	wg.Wait()
	if err := firstError(ctx, pgErr, haErr, etcdErr, provErr); err != nil {
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

// StoreMode returns StoreRegionLocal or StoreGlobal.
func (c *Cluster) StoreMode() string { return c.storeMode }

// Stop stops the cluster and returns once every process has been reaped:
// it heals every link (so that nodes can leave etcd promptly), stops every
// node concurrently (SIGTERM, then SIGKILL after the stop grace period or
// once ctx ends), then the provider, the etcd members, PgBouncer and the
// PostgreSQL server it started, and finally the proxies. It then removes
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
	if c.docker != nil {
		c.docker.rejoinAll(ctx)
	}
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
	if c.store != nil {
		// Before etcd: the agents release the leader key as they stop.
		if err := c.store.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: stop the replicated store: %w", err))
		}
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
	if c.bouncer != nil {
		// After the nodes, before the server behind it.
		c.bouncer.Stop()
	}
	if c.pg != nil {
		if err := c.pg.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: stop PostgreSQL: %w", err))
		}
	}
	if c.dockerStore != nil {
		stopAll([]*Process{c.dockerStore})
	}
	if c.net != nil {
		c.net.close()
	}
	if c.docker != nil {
		if c.docker.wan != nil {
			stopAll([]*Process{c.docker.wan})
		}
		if err := c.docker.close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: remove the containers and networks: %w", err))
		}
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
	if len(nodes) > 0 || len(etcd) > 0 || c.provider != nil || c.pg != nil || c.store != nil || c.bouncer != nil {
		c.log.Info("cluster: stopped", "elapsed", time.Since(began).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/images"
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

// DefaultTenants are the tenants that get a development token when
// Config.Tenants is empty.
func DefaultTenants() []string { return []string{"tenant-a", "tenant-b"} }

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
	// route each tenant to its home region; Start stores Regions as the
	// default region list (routing.SetDefaultRegions) and places the tenants
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

	// StoreHA runs the global store (StoreMode StoreGlobal; in
	// StoreRegionLocal mode the effects database, EffectsDatabase, which
	// every region sees, while each region keeps its own store) as a
	// replicated PostgreSQL store managed by Patroni (package
	// internal/pgha), with etcd: one member per region, named
	// StoreMemberName(region), commits acknowledged once a synchronous
	// standby has them, the leader key in the cluster's etcd. Nodes get a
	// multi-host URL (target_session_attrs=read-write) that follows the
	// primary; cluster.json lists the members (store.members). Its data is
	// in <StateDir>/store-ha, new at every Start; it starts once etcd
	// runs (the tenants are placed meanwhile). It needs the Debian
	// package "patroni"; it does not work with DatabaseURL. With TLS every
	// link of the store is TLS too (see pgha.Options.TLS).
	// Default false: one PostgreSQL server.
	StoreHA bool
	// StoreHATTL is the replicated store's leader key TTL (pgha.Options.TTL,
	// whole seconds, at least 3s): how long a primary cut off from etcd
	// keeps its role, and so the least time a failover takes. The agents'
	// retry timeout is shortened to fit it when needed. Default
	// pgha.DefaultTTL.
	StoreHATTL time.Duration

	// PgBouncer runs Debian's PgBouncer (package internal/pgbouncer) in
	// transaction pooling in front of the PostgreSQL server Start runs, and
	// every node reaches its databases (its region's or the global store,
	// and the effects database) through it, with the query mode a
	// transaction pooler needs (default_query_exec_mode=exec): the pooler
	// most production PostgreSQL has in front of it. Info's database URLs
	// are PgBouncer's, and Info.PgBouncer describes it; its log is
	// logs/pgbouncer.log. Cluster.PgBouncer returns it, so that a fault can
	// kill and restart it. With Proxied, the nodes' store links lead to
	// PgBouncer. It needs the Debian package "pgbouncer"; it does not
	// combine with StoreHA, DatabaseURL, TLS or Docker. Default false: the
	// nodes connect to PostgreSQL itself.
	PgBouncer bool

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

	// ProxiedStoreOnly narrows Proxied to the replicated store's own links
	// (StoreHA): each member's links to the etcd members and the links into
	// its PostgreSQL server and its REST API, which carry replication and
	// the agents' health checks. The nodes, etcd's members and the provider
	// then connect directly, as with Proxied false, and no copy of their
	// traffic costs the machine CPU: a partition of the store's primary
	// needs no other link. It needs Proxied and StoreHA.
	ProxiedStoreOnly bool

	// DatabaseURL, if set, names an existing PostgreSQL or CockroachDB
	// server to use instead of starting one. Start creates (or reuses) the
	// databases on it; when a single database is needed (one region, or
	// global store mode), if the role may not create databases or
	// DatabaseURL is not a postgres:// URL (a key=value string), that
	// database is DatabaseURL itself. Default: start a throwaway
	// PostgreSQL server (fsync off).
	DatabaseURL string

	// Tenants get one development token each, "dev_" and 32 random hex
	// digits, accepted by every node. Each must be a tenant name as idemd's
	// tokens file requires (no white space, ',' or '='; see
	// ident.CheckTenant). Default: DefaultTenants().
	Tenants []string

	// UnplacedTenants get a development token too, but no placement of
	// their own: with etcd, each is homed by the default rule
	// (routing.DefaultHome over Regions, which Start stores as the default
	// region list), so its first request writes nothing to etcd. Default:
	// none.
	UnplacedTenants []string

	// ReplayWindow is passed to every node as --replay-window.
	// Default 0: the node's default.
	ReplayWindow time.Duration

	// ProxyRoutes, if set, is passed to every node as --proxy-routes (the
	// sidecar's routes; see package sidecar). Default: none.
	ProxyRoutes string

	// Operations are the coordination API's operations, passed to every
	// node as --operations (see package coordclient), each a name
	// idem.ValidOperation accepts. Info lists them. Default: none (every
	// coordination request answers 404 OPERATION_UNKNOWN).
	Operations []string

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

	// Docker runs every process in a container of the local Docker engine,
	// each region on a network of its own, joined to the others only
	// through a WAN container that carries every link (see the docker
	// environment in docker.go, Cluster.IsolateRegion and
	// Cluster.CutOutbound). It implies Proxied; it needs Docker, the images
	// of `idemctl images build`, etcd (EtcdMembers) and the provider's
	// idemctl (IdemctlPath, which also runs the WAN); it does not combine
	// with TLS, StoreHA or DatabaseURL. The binaries are the host's,
	// mounted into DockerImage.
	Docker bool
	// DockerImage is the image the host's binaries run on (they are
	// dynamically linked against the C library). Default: the Debian base
	// image of `idemctl images build`.
	DockerImage string
	// DockerMounts are host paths (files or directories) mounted at the
	// same path into the containers, besides the state directory and the
	// binaries (a wrapper script and what it runs, say).
	DockerMounts []string
	// PostgresImage is the store's image. Default: the PostgreSQL image of
	// `idemctl images build`.
	PostgresImage string
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
	for _, t := range slices.Concat(cfg.Tenants, cfg.UnplacedTenants) {
		if ident.CheckTenant(t) != nil || seen[t] {
			return fmt.Errorf("cluster: invalid or duplicate tenant %q", t)
		}
		seen[t] = true
	}
	for _, op := range cfg.Operations {
		if !idem.ValidOperation(op) {
			return fmt.Errorf("cluster: invalid operation %q: want 1 to %d characters of a-z, 0-9, '_', '.' and '-', other than \".\" and \"..\"", op, idem.MaxOperationLen)
		}
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
	if cfg.ProxiedStoreOnly && (!cfg.Proxied || !cfg.StoreHA) {
		return errors.New("cluster: ProxiedStoreOnly needs Proxied and StoreHA")
	}
	if cfg.StoreHATTL != 0 && (cfg.StoreHATTL < 3*time.Second || cfg.StoreHATTL%time.Second != 0) {
		return fmt.Errorf("cluster: StoreHATTL %v: want whole seconds, at least 3s", cfg.StoreHATTL)
	}
	if cfg.EtcdMembers < 0 {
		return fmt.Errorf("cluster: EtcdMembers %d is negative", cfg.EtcdMembers)
	}
	if cfg.StoreHA {
		switch {
		case cfg.EtcdMembers == 0:
			return errors.New("cluster: StoreHA needs etcd (EtcdMembers)")
		case cfg.DatabaseURL != "":
			return errors.New("cluster: StoreHA starts its own store; DatabaseURL must be empty")
		case len(cfg.Regions) < 2:
			return errors.New("cluster: StoreHA needs at least two regions (one store member each)")
		}
	}
	if cfg.PgBouncer {
		switch {
		case cfg.StoreHA:
			return errors.New("cluster: PgBouncer does not combine with StoreHA (the nodes follow the replicated store's primary with a multi-host URL, which one PgBouncer cannot stand for)")
		case cfg.DatabaseURL != "":
			return errors.New("cluster: PgBouncer fronts the PostgreSQL server Start runs; DatabaseURL must be empty")
		case cfg.TLS:
			return errors.New("cluster: PgBouncer does not combine with TLS yet (it would terminate the nodes' TLS)")
		case cfg.Docker:
			return errors.New("cluster: PgBouncer does not combine with Docker yet")
		}
	}
	if cfg.Docker {
		switch {
		case cfg.TLS:
			return errors.New("cluster: Docker does not combine with TLS yet")
		case cfg.StoreHA:
			return errors.New("cluster: Docker does not combine with StoreHA yet")
		case cfg.DatabaseURL != "":
			return errors.New("cluster: Docker starts its own store; DatabaseURL must be empty")
		case cfg.EtcdMembers == 0:
			return errors.New("cluster: Docker needs etcd (EtcdMembers)")
		}
		cfg.Proxied = true
		debian, postgres := images.RunImages()
		if cfg.DockerImage == "" {
			cfg.DockerImage = debian
		}
		if cfg.PostgresImage == "" {
			cfg.PostgresImage = postgres
		}
		if cfg.IdemctlPath == "" {
			p, err := FindIdemctl()
			if err != nil {
				return err
			}
			cfg.IdemctlPath = p
		}
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

//go:build !operator

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/sidecar"
)

const (
	// upStartTimeout bounds the start of the whole cluster.
	upStartTimeout = 2 * time.Minute
	// upStopTimeout bounds its shutdown; nodes get cluster.DefaultStopGrace
	// of it before they are killed.
	upStopTimeout = time.Minute
)

// upDefaultRegions is the default of --regions.
const upDefaultRegions = "eu-west,us-east,ap-south"

// upDefaultEtcdMembers is the default of --etcd-members.
const upDefaultEtcdMembers = 3

// runUp implements "idemctl up": it starts a local multi-region cluster
// (PostgreSQL, etcd members, the provider simulator and idemd nodes),
// writes <state-dir>/cluster.json once every process is ready, prints the
// endpoints, dev tokens and the tenants' home regions, and runs until ctx
// ends (SIGINT or SIGTERM), when it stops every process it started and
// returns nil.
func runUp(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	stateDir := fs.String("state-dir", "", "directory for cluster.json, logs and the data of PostgreSQL, etcd and the provider, kept and reused (default: a temporary directory removed on exit)")
	dbURL := fs.String("database-url", "", "use this PostgreSQL or CockroachDB server instead of starting one; the databases are created on it")
	regions := fs.String("regions", upDefaultRegions, "comma-separated region names; tenants are placed round-robin over them")
	nodes := fs.Int("nodes-per-region", cluster.DefaultNodesPerRegion, "idemd nodes per region")
	etcdMembers := fs.Int("etcd-members", upDefaultEtcdMembers, "etcd members to run (0: no etcd; every region then serves every tenant on its own)")
	storeMode := fs.String("store-mode", cluster.StoreRegionLocal, "region-local (a database per region, requests forwarded to the tenant's home region) or global (one database for every region)")
	storeHA := fs.Bool("store-ha", false, "run the global store (--store-mode global), or in region-local mode the effects database every region shares, as PostgreSQL replicated over the regions (one member per region, synchronous replication, failover by Patroni on the cluster's etcd; needs the Debian package patroni); nodes connect with a multi-host URL that follows the primary")
	withPgBouncer := fs.Bool("pgbouncer", false, "put PgBouncer (Debian's package pgbouncer) in transaction pooling in front of PostgreSQL; every node reaches its databases through it (default_query_exec_mode=exec), and cluster.json's database URLs are PgBouncer's; not with --store-ha, --database-url or --tls")
	withProvider := fs.Bool("provider", true, "run the payment provider simulator and send payments through it")
	idemd := fs.String("idemd", "", "path of the idemd binary (default: next to idemctl, then ./bin, then PATH)")
	etcd := fs.String("etcd", "", "path of the etcd binary (default: next to idemctl, then ./bin, then PATH)")
	window := fs.Duration("replay-window", 0, "replay window of every node (default: idemd's default)")
	withTLS := fs.Bool("tls", false, "TLS everywhere: a throwaway CA and certificates for every node, etcd member and the provider; etcd with client-certificate auth and peer mTLS; nodes forward over mutual TLS; https URLs and the CA's path (caFile) in cluster.json")
	otlp := fs.String("otlp-endpoint", "", "OTLP gRPC collector every node exports its traces to (idemd --otlp-endpoint); empty: tracing off")
	proxyRoutes := fs.String("proxy-routes", "", "sidecar routes every node makes idempotent and proxies to an upstream (idemd's --proxy-routes)")
	operations := fs.String("operations", "", "comma-separated operations every node's coordination API serves (idemd's --operations), e.g. orders.create,ship; names of a-z, 0-9, '_', '.', '-'")
	autoFailover := fs.Duration("auto-failover-after", 0, "automatic failover: the nodes move a region's tenants once it has had no live node this long (idemd --auto-failover-after; 0: off, operators run idemctl region failover)")
	leaseTTL := fs.Duration("region-lease-ttl", cluster.DefaultRegionLeaseTTL, "the nodes' region lease TTL (idemd --region-lease-ttl): how soon a dead region's tenants can move")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemctl up [flags]\n\nStarts PostgreSQL, etcd, the provider simulator and idemd nodes locally and runs until interrupted.\nBuild the binaries first, from the module root: %s\n\nflags:\n", cluster.BuildCommand)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	regionList := upSplitList(*regions)
	if len(regionList) == 0 {
		return usageError{errors.New("--regions names no region")}
	}
	if *nodes < 1 {
		return usageError{fmt.Errorf("--nodes-per-region %d: want at least 1", *nodes)}
	}
	if *etcdMembers < 0 {
		return usageError{fmt.Errorf("--etcd-members %d is negative", *etcdMembers)}
	}
	if *storeMode != cluster.StoreRegionLocal && *storeMode != cluster.StoreGlobal {
		return usageError{fmt.Errorf("--store-mode %q: want %s or %s", *storeMode, cluster.StoreRegionLocal, cluster.StoreGlobal)}
	}
	if *storeHA && (*etcdMembers == 0 || *dbURL != "") {
		return usageError{errors.New("--store-ha needs etcd, and does not work with --database-url")}
	}
	if *withPgBouncer && (*storeHA || *dbURL != "" || *withTLS) {
		return usageError{errors.New("--pgbouncer fronts the PostgreSQL server idemctl up starts: not with --store-ha, --database-url or --tls")}
	}
	if *window < 0 {
		return usageError{fmt.Errorf("--replay-window %v is negative", *window)}
	}
	if *autoFailover < 0 || *leaseTTL <= 0 {
		return usageError{errors.New("--auto-failover-after must not be negative and --region-lease-ttl must be positive")}
	}
	if _, err := sidecar.ParseRoutes(*proxyRoutes); err != nil {
		return usageError{fmt.Errorf("--proxy-routes: %w", err)}
	}
	opList := upSplitList(*operations)
	for _, op := range opList {
		switch {
		case !idem.ValidOperation(op):
			return usageError{fmt.Errorf("--operations: %q is not an operation name: want 1 to %d characters of a-z, 0-9, '_', '.' and '-', other than \".\" and \"..\"", op, idem.MaxOperationLen)}
		case op == payments.Operation:
			return usageError{fmt.Errorf("--operations: %q is the nodes' own operation (POST /payments)", op)}
		}
	}
	if *idemd == "" {
		p, err := cluster.FindBinary("idemd")
		if err != nil {
			return fmt.Errorf("%w; or pass --idemd", err)
		}
		*idemd = p
	}
	if *etcd == "" && *etcdMembers > 0 {
		p, err := cluster.FindBinary("etcd")
		if err != nil {
			return fmt.Errorf("%w; or pass --etcd (or --etcd-members 0)", err)
		}
		*etcd = p
	}
	var idemctl string
	if *withProvider {
		p, err := cluster.FindIdemctl()
		if err != nil {
			return fmt.Errorf("%w; the provider simulator runs as idemctl provider (or pass --provider=false)", err)
		}
		idemctl = p
	}

	stderr := &upSyncWriter{w: env.Stderr}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	startCtx, cancel := context.WithTimeout(ctx, upStartTimeout)
	defer cancel()
	began := time.Now()
	var nodeArgs []string
	if *otlp != "" {
		nodeArgs = []string{"--otlp-endpoint", *otlp}
	}
	if *autoFailover > 0 {
		nodeArgs = append(nodeArgs, "--auto-failover-after", autoFailover.String())
	}
	c, err := cluster.Start(startCtx, cluster.Config{
		ExtraNodeArgs:  nodeArgs,
		RegionLeaseTTL: *leaseTTL,
		StateDir:       *stateDir,
		Regions:        regionList,
		NodesPerRegion: *nodes,
		IdemdPath:      *idemd,
		EtcdMembers:    *etcdMembers,
		EtcdPath:       *etcd,
		Provider:       *withProvider,
		IdemctlPath:    idemctl,
		StoreMode:      *storeMode,
		StoreHA:        *storeHA,
		PgBouncer:      *withPgBouncer,
		DatabaseURL:    *dbURL,
		ReplayWindow:   *window,
		ProxyRoutes:    *proxyRoutes,
		Operations:     opList,
		Logger:         logger,
		TLS:            *withTLS,
	})
	if err != nil {
		if errors.Is(err, pgserver.ErrNotInstalled) {
			return fmt.Errorf("%w\n(or use an existing server: idemctl up --database-url postgres://...)", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted while starting: %w", err)
		}
		return err
	}
	printUpSummary(env.Stdout, c, *stateDir == "", time.Since(began))

	// Report processes that die on their own while the cluster runs.
	watchCtx, stopWatching := context.WithCancel(ctx)
	var wg sync.WaitGroup
	procs := append(c.Nodes(), c.EtcdMembers()...)
	if p := c.Provider(); p != nil {
		procs = append(procs, p)
	}
	for _, p := range procs {
		wg.Go(func() {
			err := p.Wait(watchCtx)
			if watchCtx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("exit status 0")
			}
			fmt.Fprintf(stderr, "idemctl up: %s %s (%s) exited unexpectedly: %v; see %s\n", p.Kind(), p.Name(), p.URL(), err, p.LogPath())
		})
	}
	<-ctx.Done()
	stopWatching()
	wg.Wait()

	fmt.Fprintln(stderr, "idemctl up: stopping the cluster")
	stopCtx, cancelStop := context.WithTimeout(context.Background(), upStopTimeout)
	defer cancelStop()
	if err := c.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}

// upSplitList splits a comma-separated list, dropping empty items.
func upSplitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// printUpSummary prints the endpoints, databases, tokens with the tenants'
// home regions, and a request to try.
func printUpSummary(w io.Writer, c *cluster.Cluster, tempState bool, took time.Duration) {
	info := c.Info()
	nodes := len(c.Nodes()) / max(len(info.Regions), 1)
	extras := ""
	if n := len(info.EtcdEndpoints); n > 0 {
		extras += ", " + upPlural(n, "etcd member")
	}
	if info.ProviderURL != "" {
		extras += ", provider simulator"
	}
	fmt.Fprintf(w, "idem cluster ready in %v: %s, %s each%s; %s store\n\n",
		took.Round(10*time.Millisecond), upPlural(len(info.Regions), "region"), upPlural(nodes, "node"), extras, info.StoreMode)

	width := len("all regions")
	for _, r := range info.Regions {
		width = max(width, len(r.Name))
	}
	fmt.Fprintln(w, "Regions:")
	for _, r := range info.Regions {
		fmt.Fprintf(w, "  %-*s  %s\n", width, r.Name, strings.Join(r.Nodes, "  "))
	}
	fmt.Fprintln(w, "\nDatabase:")
	switch {
	case info.Store != nil:
		// The multi-host URL holds the password: it is in cluster.json.
		fmt.Fprintf(w, "  %-*s  replicated (Patroni), multi-host URL in cluster.json (regions[].databaseUrl)\n", width, "all regions")
		for _, m := range info.Store.Members {
			fmt.Fprintf(w, "  %-*s  %s  (Patroni API %s)\n", width, m.Region, m.URL, m.APIURL)
		}
	case info.StoreMode == cluster.StoreGlobal:
		fmt.Fprintf(w, "  %-*s  %s\n", width, "all regions", info.DatabaseURL)
	default:
		for _, r := range info.Regions {
			fmt.Fprintf(w, "  %-*s  %s\n", width, r.Name, r.DatabaseURL)
		}
	}
	if b := info.PgBouncer; b != nil {
		fmt.Fprintf(w, "  through PgBouncer at %s (%s pooling; log %s), in front of %s\n", b.Addr, b.PoolMode, b.Log, b.ServerURL)
	}
	fmt.Fprintln(w, "\nMetrics (Prometheus):")
	for _, r := range info.Regions {
		for _, n := range r.Nodes {
			fmt.Fprintf(w, "  %-*s  %s/metrics\n", width, r.Name, n)
		}
	}
	if len(info.EtcdEndpoints) > 0 {
		fmt.Fprintf(w, "\netcd:\n  %s\n", strings.Join(info.EtcdEndpoints, "  "))
	}
	if info.ProviderURL != "" {
		fmt.Fprintf(w, "\nProvider simulator:\n  %s\n", info.ProviderURL)
	}

	tenants := make([]string, 0, len(info.Tokens))
	for t := range info.Tokens {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	if len(info.Placements) > 0 {
		fmt.Fprintln(w, "\nDev tokens (home region; any region accepts the tenant's requests):")
	} else {
		fmt.Fprintln(w, "\nDev tokens:")
	}
	for _, t := range tenants {
		if home := info.Placements[t]; home != "" {
			fmt.Fprintf(w, "  %s  %s  home %s\n", t, info.Tokens[t], home)
		} else {
			fmt.Fprintf(w, "  %s  %s\n", t, info.Tokens[t])
		}
	}

	if info.CAFile != "" {
		fmt.Fprintf(w, "\nCA certificate (every URL is https):\n  %s\n", info.CAFile)
	}

	state := c.StatePath()
	if tempState {
		fmt.Fprintf(w, "\nState: %s, logs in %s (temporary: removed on exit)\n", state, filepath.Join(c.StateDir(), "logs"))
	} else {
		fmt.Fprintf(w, "\nState: %s, logs in %s\n", state, filepath.Join(c.StateDir(), "logs"))
	}

	if len(info.Regions) > 0 && len(tenants) > 0 {
		cacert := ""
		if info.CAFile != "" {
			cacert = "--cacert " + info.CAFile + " "
		}
		fmt.Fprintf(w, "\nTry:\n  curl -s %s-X POST %s/payments -H 'Authorization: Bearer %s' -H 'Idempotency-Key: abc-123' -H 'Content-Type: application/json' -d '%s'\n",
			cacert, info.Regions[0].URL, info.Tokens[tenants[0]], upSamplePayment)
		if len(info.Operations) > 0 {
			fmt.Fprintf(w, "\nCoordination API (operations %s):\n  curl -s %s-X POST %s/v1/coordination/%s/abc-123/begin -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '%s'\n",
				strings.Join(info.Operations, ", "), cacert, info.Regions[0].URL, info.Operations[0], info.Tokens[tenants[0]], upSampleCommand)
		}
	}
	fmt.Fprintln(w, "\nPress Ctrl-C to stop.")
}

// upSamplePayment is the body of the example request.
const upSamplePayment = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`

// upSampleCommand is the body of the example coordination begin.
const upSampleCommand = `{"command":{"sku":"book-1","quantity":1}}`

func upPlural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// upSyncWriter serializes writes to w, which the logger and the node
// watchers share.
type upSyncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *upSyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

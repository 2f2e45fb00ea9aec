// Package idemtest starts an idem cluster in containers for integration
// tests: a PostgreSQL store with one database per region, etcd, and N
// regions of idemd nodes on a private Docker network, in the style of
// testcontainers-go's own modules.
//
//	c, err := idemtest.Run(ctx, idemtest.WithRegions("eu-west", "us-east"))
//	idemtest.Cleanup(t, c) // before the error check, like testcontainers.CleanupContainer
//	if err != nil { t.Fatal(err) }
//	url := c.URL("us-east")        // http://127.0.0.1:PORT, reachable from the test
//	token := c.Tokens["tenant-a"]  // tenant-a's home is eu-west: us-east forwards
//
// The images are built locally by `idemctl images build` (nothing is
// pulled): DefaultIdemImage and DefaultPostgresImage name them. Every
// start is awaited with wait strategies (the store accepting connections,
// etcd's /health, each node's /readyz, then each node routing every
// tenant to its home region), never with sleeps; when Run fails, its error
// holds the tail of the failing container's log, and Cleanup writes every
// container's log to the test log when the test failed.
//
// testcontainers-go starts a "Ryuk" reaper container by default, whose
// image it pulls from Docker Hub. Where nothing can be pulled, set
// TESTCONTAINERS_RYUK_DISABLED=true (or ryuk.disabled=true in
// ~/.testcontainers.properties): Cleanup and Terminate remove the
// containers and the network themselves.
package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/routing"
)

// Default images, as `idemctl images build` tags them.
const (
	DefaultIdemImage     = "idem/idem:dev"
	DefaultPostgresImage = "idem/postgres:15"
)

// Ports inside the containers.
const (
	nodePort     = "8080/tcp"
	etcdPort     = "2379/tcp"
	postgresPort = "5432/tcp"
	// routingProbe is a payment id that does not exist: a node routes a
	// tenant once GET /payments/<routingProbe> is answered by the home
	// region (404), not refused (421, 5xx).
	routingProbe = "idemtest-routing-probe"
	// startupTimeout bounds each wait strategy: images start in seconds,
	// but a loaded CI machine may be slow.
	startupTimeout = 3 * time.Minute
)

// Option configures Run.
type Option func(*config)

type config struct {
	regions       []string
	nodesPerRgn   int
	tenants       []string
	idemImage     string
	postgresImage string
	nodeEnv       map[string]string
	logger        testcontainers.ContainerCustomizer
}

// WithRegions sets the regions (default "eu-west", "us-east").
func WithRegions(names ...string) Option {
	return func(c *config) { c.regions = slices.Clone(names) }
}

// WithNodesPerRegion sets the number of idemd nodes in each region
// (default 1).
func WithNodesPerRegion(n int) Option { return func(c *config) { c.nodesPerRgn = n } }

// WithTenants sets the tenants that get a token; tenant i is placed in
// region i modulo the number of regions (default "tenant-a", "tenant-b").
func WithTenants(names ...string) Option {
	return func(c *config) { c.tenants = slices.Clone(names) }
}

// WithImages sets the idem and PostgreSQL images (an empty name keeps the
// default).
func WithImages(idem, postgres string) Option {
	return func(c *config) {
		if idem != "" {
			c.idemImage = idem
		}
		if postgres != "" {
			c.postgresImage = postgres
		}
	}
}

// WithNodeEnv adds IDEM_* settings to every node (for example
// IDEM_REPLAY_WINDOW); it cannot override those Run sets.
func WithNodeEnv(env map[string]string) Option {
	return func(c *config) {
		if c.nodeEnv == nil {
			c.nodeEnv = map[string]string{}
		}
		maps.Copy(c.nodeEnv, env)
	}
}

// WithTestLogger sends testcontainers' progress lines to tb's log instead
// of standard output.
func WithTestLogger(tb testing.TB) Option {
	return func(c *config) { c.logger = testcontainers.WithLogger(testcontainersTestLogger(tb)) }
}

// Cluster is a running cluster. Its fields are read-only.
type Cluster struct {
	// Regions, in the order of WithRegions.
	Regions []Region
	// Tokens maps each tenant to its bearer token.
	Tokens map[string]string
	// Homes maps each tenant to its home region.
	Homes map[string]string
	// EtcdEndpoint is etcd's client URL as the test reaches it.
	EtcdEndpoint string
	// Network is the name of the private Docker network.
	Network string

	mu         sync.Mutex
	network    *testcontainers.DockerNetwork
	containers []*named
}

// Region is one region's nodes and store.
type Region struct {
	Name string
	// DatabaseURL is the region's database as the test reaches it.
	DatabaseURL string
	Nodes       []Node
}

// Node is one idemd container.
type Node struct {
	Name string
	// URL is the node's base URL as the test reaches it (http://host:port).
	URL string
	// Container is the node's container, to stop or inspect it.
	Container *testcontainers.DockerContainer
}

type named struct {
	name string
	c    *testcontainers.DockerContainer
}

// Region returns the region called name (the zero Region if there is none).
func (c *Cluster) Region(name string) Region {
	for _, r := range c.Regions {
		if r.Name == name {
			return r
		}
	}
	return Region{}
}

// URL returns the URL of the first node of region ("" for an unknown
// region).
func (c *Cluster) URL(region string) string {
	r := c.Region(region)
	if len(r.Nodes) == 0 {
		return ""
	}
	return r.Nodes[0].URL
}

// Run starts a cluster and returns once every node serves and routes every
// tenant. On error it returns the part it started (Terminate or Cleanup
// removes it) and an error holding the tail of the failing container's
// log.
func Run(ctx context.Context, opts ...Option) (*Cluster, error) {
	cfg := config{
		regions:       []string{"eu-west", "us-east"},
		nodesPerRgn:   1,
		tenants:       []string{"tenant-a", "tenant-b"},
		idemImage:     DefaultIdemImage,
		postgresImage: DefaultPostgresImage,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.regions) == 0 || cfg.nodesPerRgn < 1 || len(cfg.tenants) == 0 {
		return nil, errors.New("idemtest: need at least one region, node and tenant")
	}
	for _, r := range cfg.regions {
		if !validName(r) {
			return nil, fmt.Errorf("idemtest: region name %q: use a-z, 0-9 and '-'", r)
		}
	}
	c := &Cluster{Tokens: map[string]string{}, Homes: map[string]string{}}
	nw, err := tcnetwork.New(ctx)
	if err != nil {
		return c, fmt.Errorf("idemtest: network: %w", err)
	}
	c.network, c.Network = nw, nw.Name

	pgPassword, err := randomHex(16)
	if err != nil {
		return c, err
	}
	peerSecret, err := randomHex(24)
	if err != nil {
		return c, err
	}
	var tokenPairs []string
	for i, t := range cfg.tenants {
		tok, err := randomHex(16)
		if err != nil {
			return c, err
		}
		c.Tokens[t] = "tok_" + tok
		c.Homes[t] = cfg.regions[i%len(cfg.regions)]
		tokenPairs = append(tokenPairs, c.Tokens[t]+"="+t)
	}
	var dbs []string
	for _, r := range cfg.regions {
		dbs = append(dbs, dbName(r))
	}

	// The store and etcd start together.
	var (
		pg, etcd       *testcontainers.DockerContainer
		pgErr, etcdErr error
		wg             sync.WaitGroup
	)
	wg.Go(func() {
		pg, pgErr = c.start(ctx, "store", cfg, cfg.postgresImage,
			testcontainers.WithEnv(map[string]string{
				"POSTGRES_PASSWORD":  pgPassword,
				"POSTGRES_DATABASES": strings.Join(dbs, " "),
			}),
			testcontainers.WithExposedPorts(postgresPort),
			testcontainers.WithWaitStrategy(wait.ForAll(
				wait.ForLog("database system is ready to accept connections"),
				wait.ForListeningPort(postgresPort).SkipInternalCheck(),
			).WithDeadline(startupTimeout)))
	})
	wg.Go(func() {
		etcd, etcdErr = c.start(ctx, "etcd", cfg, cfg.idemImage,
			testcontainers.WithEntrypoint("/usr/local/bin/etcd"),
			testcontainers.WithCmd("--name", "etcd",
				"--data-dir", "/var/lib/etcd/data",
				"--listen-client-urls", "http://0.0.0.0:2379",
				"--advertise-client-urls", "http://etcd:2379",
				"--listen-peer-urls", "http://0.0.0.0:2380",
				"--initial-advertise-peer-urls", "http://etcd:2380",
				"--initial-cluster", "etcd=http://etcd:2380"),
			testcontainers.WithExposedPorts(etcdPort),
			testcontainers.WithWaitStrategy(wait.ForHTTP("/health").WithPort(etcdPort).
				WithStartupTimeout(startupTimeout)))
	})
	wg.Wait()
	if err := errors.Join(pgErr, etcdErr); err != nil {
		return c, err
	}
	pgHostPort, err := pg.PortEndpoint(ctx, postgresPort, "")
	if err != nil {
		return c, fmt.Errorf("idemtest: store port: %w", err)
	}
	if c.EtcdEndpoint, err = etcd.PortEndpoint(ctx, etcdPort, "http"); err != nil {
		return c, fmt.Errorf("idemtest: etcd port: %w", err)
	}
	if err := c.place(ctx, cfg); err != nil {
		return c, err
	}

	// Nodes: the first of each region applies its database's migrations
	// (concurrent first-time migrations of one database can fail in
	// PostgreSQL's catalog), then the others start together.
	baseEnv := map[string]string{
		"IDEM_LISTEN":           "0.0.0.0:8080",
		"IDEM_AUTH_TOKENS":      strings.Join(tokenPairs, ","),
		"IDEM_ETCD_ENDPOINTS":   "http://etcd:2379",
		"IDEM_STORE_MODE":       "region-local",
		"IDEM_PEER_SECRET_FILE": "/var/lib/idem/peer-secret",
	}
	for k, v := range cfg.nodeEnv {
		if _, set := baseEnv[k]; !set {
			baseEnv[k] = v
		}
	}
	c.Regions = make([]Region, len(cfg.regions))
	for i, r := range cfg.regions {
		c.Regions[i] = Region{
			Name:        r,
			DatabaseURL: fmt.Sprintf("postgres://postgres:%s@%s/%s?sslmode=disable", pgPassword, pgHostPort, dbName(r)),
			Nodes:       make([]Node, cfg.nodesPerRgn),
		}
	}
	for _, batch := range [][2]int{{0, 1}, {1, cfg.nodesPerRgn}} {
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for ri, r := range cfg.regions {
			for n := batch[0]; n < batch[1]; n++ {
				wg.Go(func() {
					node, err := c.startNode(ctx, cfg, baseEnv, r, n, pgPassword, peerSecret)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					c.Regions[ri].Nodes[n] = node
				})
			}
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return c, err
		}
	}
	if err := c.waitRouting(ctx, cfg); err != nil {
		return c, err
	}
	return c, nil
}

// start runs one container on the cluster's network under alias name.
func (c *Cluster) start(ctx context.Context, name string, cfg config, image string, opts ...testcontainers.ContainerCustomizer) (*testcontainers.DockerContainer, error) {
	all := append([]testcontainers.ContainerCustomizer{
		tcnetwork.WithNetwork([]string{name}, c.network),
		testcontainers.WithLabels(map[string]string{"org.idemcoord.idemtest": name}),
	}, opts...)
	if cfg.logger != nil {
		all = append(all, cfg.logger)
	}
	ctr, err := testcontainers.Run(ctx, image, all...)
	if ctr != nil {
		c.mu.Lock()
		c.containers = append(c.containers, &named{name, ctr})
		c.mu.Unlock()
	}
	if err != nil {
		return ctr, fmt.Errorf("idemtest: %s (%s): %w%s", name, image, err, logTail(ctx, ctr))
	}
	return ctr, nil
}

// startNode starts node n of region r.
func (c *Cluster) startNode(ctx context.Context, cfg config, baseEnv map[string]string, r string, n int, pgPassword, peerSecret string) (Node, error) {
	name := fmt.Sprintf("idemd-%s-%d", r, n)
	env := maps.Clone(baseEnv)
	env["IDEM_REGION"] = r
	env["IDEM_NODE_ID"] = name
	env["IDEM_ADVERTISE_URL"] = "http://" + name + ":8080"
	env["IDEM_DATABASE_URL"] = fmt.Sprintf("postgres://postgres:%s@store:5432/%s?sslmode=disable", pgPassword, dbName(r))
	ctr, err := c.start(ctx, name, cfg, cfg.idemImage,
		testcontainers.WithEnv(env),
		testcontainers.WithFiles(testcontainers.ContainerFile{
			Reader:            strings.NewReader(peerSecret),
			ContainerFilePath: "/var/lib/idem/peer-secret",
			// The file is copied in as root; the node runs as uid 65532.
			FileMode: 0o444,
		}),
		testcontainers.WithExposedPorts(nodePort),
		testcontainers.WithWaitStrategy(wait.ForHTTP("/readyz").WithPort(nodePort).
			WithStartupTimeout(startupTimeout)))
	if err != nil {
		return Node{}, err
	}
	url, err := ctr.PortEndpoint(ctx, nodePort, "http")
	if err != nil {
		return Node{}, fmt.Errorf("idemtest: %s port: %w", name, err)
	}
	return Node{Name: name, URL: url, Container: ctr}, nil
}

// place stores the regions as etcd's default region list and each tenant's
// placement, before any node starts.
func (c *Cluster) place(ctx context.Context, cfg config) error {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.EtcdEndpoint},
		DialTimeout: 10 * time.Second,
		Logger:      nopZap(),
	})
	if err != nil {
		return fmt.Errorf("idemtest: etcd client: %w", err)
	}
	defer cli.Close()
	if _, err := routing.SetDefaultRegions(ctx, cli, cfg.regions); err != nil {
		return fmt.Errorf("idemtest: default regions: %w", err)
	}
	for _, t := range cfg.tenants {
		if _, err := routing.SetPlacement(ctx, cli, t, c.Homes[t]); err != nil {
			return fmt.Errorf("idemtest: placement of %s: %w", t, err)
		}
	}
	return nil
}

// waitRouting waits, with an HTTP wait strategy per node and tenant, until
// every node routes every tenant to its home region: a node learns of the
// other regions' nodes through an etcd watch, which may lag behind their
// readiness.
func (c *Cluster) waitRouting(ctx context.Context, cfg config) error {
	var errs []error
	for _, r := range c.Regions {
		for _, n := range r.Nodes {
			for _, t := range cfg.tenants {
				s := wait.ForHTTP("/payments/" + routingProbe).WithPort(nodePort).
					WithHeaders(map[string]string{"Authorization": "Bearer " + c.Tokens[t]}).
					WithStatusCodeMatcher(func(code int) bool {
						return code < 500 && code != http.StatusMisdirectedRequest
					}).
					WithStartupTimeout(startupTimeout)
				if err := s.WaitUntilReady(ctx, n.Container); err != nil {
					errs = append(errs, fmt.Errorf("idemtest: %s does not route %s to %s: %w%s", n.Name, t, c.Homes[t], err, logTail(ctx, n.Container)))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Terminate stops and removes every container and the network. It may be
// called on the partial cluster a failed Run returns.
func (c *Cluster) Terminate(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	ctrs := c.containers
	c.containers = nil
	nw := c.network
	c.network = nil
	c.mu.Unlock()
	errs := make([]error, len(ctrs))
	var wg sync.WaitGroup
	for i, n := range ctrs {
		wg.Go(func() { errs[i] = n.c.Terminate(ctx) })
	}
	wg.Wait()
	if nw != nil {
		errs = append(errs, nw.Remove(ctx))
	}
	return errors.Join(errs...)
}

// Logs writes every container's log to w, each under a header line.
func (c *Cluster) Logs(ctx context.Context, w io.Writer) error {
	c.mu.Lock()
	ctrs := slices.Clone(c.containers)
	c.mu.Unlock()
	var errs []error
	for _, n := range ctrs {
		fmt.Fprintf(w, "=== %s (%s) ===\n", n.name, n.c.GetContainerID()[:12])
		rc, err := n.c.Logs(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_, err = io.Copy(w, rc)
		errs = append(errs, err, rc.Close())
	}
	return errors.Join(errs...)
}

// Cleanup registers the cluster's removal with tb, in the manner of
// testcontainers.CleanupContainer: call it right after Run, before checking
// Run's error (c may be partial or nil). If the test failed by then, every
// container's log goes to the test log first.
func Cleanup(tb testing.TB, c *Cluster) {
	tb.Helper()
	tb.Cleanup(func() {
		if c == nil {
			return
		}
		ctx := context.Background()
		if tb.Failed() {
			var buf bytes.Buffer
			if err := c.Logs(ctx, &buf); err != nil {
				fmt.Fprintf(&buf, "(logs: %v)\n", err)
			}
			tb.Logf("container logs:\n%s", buf.Bytes())
		}
		if err := c.Terminate(ctx); err != nil {
			tb.Errorf("idemtest: terminate: %v", err)
		}
	})
}

// logTail returns the last lines of a container's log, for an error.
func logTail(ctx context.Context, ctr *testcontainers.DockerContainer) string {
	if ctr == nil {
		return ""
	}
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "\n--- last log lines ---\n" + strings.Join(lines, "\n")
}

func dbName(region string) string { return "idem_" + strings.ReplaceAll(region, "-", "_") }

func validName(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("idemtest: random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/images"
)

// The docker environment (Config.Docker) runs every process of the cluster
// in a container of the local Docker engine, and gives each region a
// network of its own:
//
//	idem-<id>-<region>     the region's nodes and its etcd member
//	idem-<id>-services     PostgreSQL (every region's database and the
//	                       effects database) and the provider simulator
//	idem-<id>-etcd-m<i>    an etcd member beyond one per region
//
// Networks reach each other only through the WAN container, a toxiproxy
// server (idemctl wan-proxy) attached to every network under the alias
// "wan": every link of the cluster is one of its proxies, so the links, and
// their names, are those of the process environment (see Link), and
// latency and link partitions work as there. On top of that the network
// layer itself can fail: IsolateRegion drops, with iptables in the WAN
// container's network namespace, every packet to or from a region's
// network (every cross-region link of the region, etcd peers, the
// store and forwarded requests, fails at once, with no connection closed
// cleanly), and CutOutbound drops, with iptables in the WAN container's
// network namespace, every connection the region opens while the
// connections others open into it still work (an asymmetric partition).
// The harness itself reaches every container directly, over the engine's
// bridges, as the process environment reaches 127.0.0.1.
//
// Binaries are the host's (Config.IdemdPath and the others), bind-mounted
// into the Debian base image that `idemctl images build` makes, with the
// state directory mounted at its own path, so logs and data directories
// are where the process environment keeps them.

// docker ports inside containers: every container has an address of its
// own, so they are fixed.
const (
	dockerNodePort     = 8080
	dockerProviderPort = 8090
	dockerEtcdClient   = 2379
	dockerEtcdPeer     = 2380
	dockerPostgresPort = 5432
	dockerWANAPIPort   = 8474
	// dockerPeerPortBase + j is the port the WAN listens on for links to
	// etcd member j (one listener per dialing network, same port).
	dockerPeerPortBase = 12380
	// dockerLinkPortBase is the first port of the other links.
	dockerLinkPortBase = 20000
	// servicesNet is the logical network of the store and the provider.
	servicesNet = "services"
	// wanAlias is the WAN container's name on every network.
	wanAlias = "wan"
	// dockerLabel marks every container and network of a docker cluster.
	dockerLabel = "io.idem.cluster"
)

// ErrNotDocker is returned by the network-layer methods of a cluster that
// does not run in the docker environment.
var ErrNotDocker = errors.New("cluster: the cluster does not run in the docker environment (Config.Docker is false)")

// dockerEnv is a cluster's containers and networks.
type dockerEnv struct {
	id       string // random, names everything
	cli      string // the docker CLI
	image    string // base image for host binaries
	pgImage  string
	stateDir string
	regions  []string
	etcd     int      // etcd members
	mounts   []string // Config.DockerMounts

	mu       sync.Mutex
	nets     map[string]*dockerNet // logical name -> network
	netOrder []string
	nextPort int
	wan      *Process
	wanPid   int
	isolated map[string]bool // region -> WAN disconnected
	cut      map[string]bool // region -> outbound connections dropped
}

type dockerNet struct {
	name   string // Docker's name
	prefix string // "10.A.B", a /24
	next   int    // next host address to hand out
	wanIP  string
}

// checkDocker fails unless the docker CLI is present and the engine
// answers.
func checkDocker(ctx context.Context) (string, error) {
	cli, err := exec.LookPath("docker")
	if err != nil {
		return "", fmt.Errorf("cluster: Docker: no docker CLI on PATH: %w", err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(vctx, cli, "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("cluster: Docker: the engine does not answer: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return cli, nil
}

// DockerAvailable reports whether a cluster can run in the docker
// environment with the given images (default: the Debian base and the
// PostgreSQL image of `idemctl images build`): a docker CLI, an engine that
// answers, and the images in it, since nothing is pulled. Its error says
// what is missing in one line, for a test to skip with.
func DockerAvailable(ctx context.Context, imgs ...string) error {
	_, err := dockerWithImages(ctx, imgs...)
	return err
}

func dockerWithImages(ctx context.Context, imgs ...string) (string, error) {
	if len(imgs) == 0 {
		debian, postgres := images.RunImages()
		imgs = []string{debian, postgres}
	}
	cli, err := checkDocker(ctx)
	if err != nil {
		return "", err
	}
	for _, img := range imgs {
		if _, err := exec.CommandContext(ctx, cli, "image", "inspect", "--format", "{{.Id}}", img).Output(); err != nil {
			return "", fmt.Errorf("cluster: Docker: image %s is not in the engine (build it: go run ./cmd/idemctl images build)", img)
		}
	}
	return cli, nil
}

func newDockerEnv(ctx context.Context, cfg *Config, stateDir string) (*dockerEnv, error) {
	cli, err := dockerWithImages(ctx, cfg.DockerImage, cfg.PostgresImage)
	if err != nil {
		return nil, err
	}
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	return &dockerEnv{
		id: hex.EncodeToString(id[:]), cli: cli, image: cfg.DockerImage, pgImage: cfg.PostgresImage,
		stateDir: stateDir, regions: cfg.Regions, etcd: cfg.EtcdMembers, mounts: cfg.DockerMounts,
		nets: map[string]*dockerNet{}, nextPort: dockerLinkPortBase,
		isolated: map[string]bool{}, cut: map[string]bool{},
	}, nil
}

// run runs the docker CLI and returns its output.
func (d *dockerEnv) run(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, d.cli, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args[:min(len(args), 3)], " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// netOf (which reads only fields fixed at creation, so needs no lock)
// returns the logical network of an endpoint: a node's region, the
// region of etcd member i (i < regions) or its own network, services for
// the store, the effects database and the provider.
func (d *dockerEnv) netOf(endpoint string) string {
	var i int
	if _, err := fmt.Sscanf(endpoint, "etcd-m%d", &i); err == nil && strconv.Itoa(i) == strings.TrimPrefix(endpoint, "etcd-m") {
		if i < len(d.regions) {
			return d.regions[i]
		}
		return endpoint
	}
	switch endpoint {
	case EndpointStore, EndpointEffects, EndpointProvider:
		return servicesNet
	}
	for _, r := range d.regions {
		if strings.HasPrefix(endpoint, r+"-") {
			if _, err := strconv.Atoi(strings.TrimPrefix(endpoint, r+"-")); err == nil {
				return r
			}
		}
	}
	return servicesNet
}

// createNetworks creates every network the cluster uses, each on a /24 of
// 10.0.0.0/8 picked at random (another one if the engine already uses it).
func (d *dockerEnv) createNetworks(ctx context.Context) error {
	logical := append(slices.Clone(d.regions), servicesNet)
	for i := len(d.regions); i < d.etcd; i++ {
		logical = append(logical, fmt.Sprintf("etcd-m%d", i))
	}
	for _, l := range logical {
		name := "idem-" + d.id + "-" + l
		var lastErr error
		for range 20 {
			a, _ := rand.Int(rand.Reader, big.NewInt(155))
			b, _ := rand.Int(rand.Reader, big.NewInt(256))
			prefix := fmt.Sprintf("10.%d.%d", 100+a.Int64(), b.Int64())
			_, lastErr = d.run(ctx, "network", "create", "--driver", "bridge", "--subnet", prefix+".0/24",
				"--label", dockerLabel+"="+d.id, name)
			if lastErr == nil {
				d.mu.Lock()
				d.nets[l] = &dockerNet{name: name, prefix: prefix, next: 10, wanIP: prefix + ".2"}
				d.netOrder = append(d.netOrder, l)
				d.mu.Unlock()
				break
			}
			if !strings.Contains(lastErr.Error(), "overlap") {
				return fmt.Errorf("cluster: Docker network %s: %w", name, lastErr)
			}
		}
		if lastErr != nil {
			return fmt.Errorf("cluster: Docker network %s: %w", name, lastErr)
		}
	}
	return nil
}

// ip hands out the next address of a logical network.
func (d *dockerEnv) ip(logical string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nets[logical]
	ip := fmt.Sprintf("%s.%d", n.prefix, n.next)
	n.next++
	return ip
}

// listenFor is the network's listenFor: where the WAN listens for the link
// from->to. An etcd member's peer links listen on the dialing network's WAN
// address and a port of the target member's (its advertised peer URL is
// wan:<that port>, the same for every member); a node's ingress link on
// every address; the others on the dialer's network only.
func (d *dockerEnv) listenFor(from, to string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var j int
	if strings.HasPrefix(from, "etcd-m") {
		if _, err := fmt.Sscanf(to, "etcd-m%d", &j); err == nil {
			return fmt.Sprintf("%s:%d", d.nets[d.netOf(from)].wanIP, dockerPeerPortBase+j)
		}
	}
	port := d.nextPort
	d.nextPort++
	if from == "" {
		return fmt.Sprintf("0.0.0.0:%d", port)
	}
	return fmt.Sprintf("%s:%d", d.nets[d.netOf(from)].wanIP, port)
}

// viaWAN turns a link's listen address into the address other networks
// dial: wan:<port>.
func viaWAN(listen string) string {
	return wanAlias + listen[strings.LastIndexByte(listen, ':'):]
}

// container is how a Process runs in the docker environment.
type container struct {
	d     *dockerEnv
	name  string
	image string
	// nets are the logical networks joined, with the address on each and
	// whether the WAN alias goes with it.
	nets []containerNet
	// envFile receives the process's environment (which may hold
	// secrets: never on a command line).
	envFile string
	// stopSignal, if set, replaces SIGTERM (PostgreSQL shuts down fast
	// on SIGINT, and waits for its clients on SIGTERM).
	stopSignal syscall.Signal
}

type containerNet struct {
	logical, ip string
	wan         bool
}

// newContainer describes a container for the process name on the logical
// network net (its address handed out now).
func (d *dockerEnv) newContainer(name, logical, image string) *container {
	return &container{
		d: d, name: "idem-" + d.id + "-" + name, image: image,
		nets:    []containerNet{{logical: logical, ip: d.ip(logical)}},
		envFile: filepath.Join(d.stateDir, "secrets", "env-"+name),
	}
}

// runArgs is the docker command line for path (empty: the image's
// entrypoint) with args. The environment goes through the env file.
func (c *container) runArgs(path string, args, env []string) ([]string, error) {
	var b strings.Builder
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.ContainsAny(kv, "\n\r") || !(strings.HasPrefix(k, "IDEM_") || strings.HasPrefix(k, "GO") || strings.HasPrefix(k, "POSTGRES_")) {
			continue
		}
		b.WriteString(kv + "\n")
	}
	if err := os.MkdirAll(filepath.Dir(c.envFile), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.envFile, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	out := []string{"run", "--rm", "--name", c.name, "--label", dockerLabel + "=" + c.d.id,
		"--hostname", strings.TrimPrefix(c.name, "idem-"+c.d.id+"-"), "--env-file", c.envFile, "--stop-timeout", "5"}
	// The first network only: the engine may refuse several at creation;
	// the WAN container joins the others once it runs (startWAN).
	c.d.mu.Lock()
	n := c.nets[0]
	out = append(out, "--network", c.d.nets[n.logical].name, "--ip", n.ip)
	if n.wan {
		out = append(out, "--network-alias", wanAlias)
	}
	c.d.mu.Unlock()
	if path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, err
		}
		path = abs
	}
	mounts := append([]string{c.d.stateDir}, c.d.mounts...)
	if path != "" && !slices.Contains(mounts, path) {
		mounts = append(mounts, path)
	}
	for _, m := range mounts {
		abs, err := filepath.Abs(m)
		if err != nil {
			return nil, err
		}
		out = append(out, "--volume", abs+":"+abs)
	}
	out = append(out, c.image)
	if path != "" {
		out = append(out, path)
	}
	return append(out, args...), nil
}

// signal delivers sig to the container: SIGSTOP and SIGCONT pause and
// resume it (the cgroup freezer), others go to its main process.
func (c *container) signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if sig == syscall.SIGTERM && c.stopSignal != 0 {
		sig = c.stopSignal
	}
	switch sig {
	case syscall.SIGSTOP:
		_, err = c.d.run(ctx, "pause", c.name)
	case syscall.SIGCONT:
		_, err = c.d.run(ctx, "unpause", c.name)
		if err != nil && strings.Contains(err.Error(), "not paused") {
			err = nil
		}
	default:
		_, err = c.d.run(ctx, "kill", "--signal", strconv.Itoa(int(sig)), c.name)
	}
	if err != nil && (strings.Contains(err.Error(), "No such container") || strings.Contains(err.Error(), "is not running")) {
		return fmt.Errorf("%w: %v", os.ErrProcessDone, err)
	}
	return err
}

// remove removes a container left by an earlier run of the process (its
// --rm removal may still be under way).
func (c *container) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = c.d.run(ctx, "rm", "--force", c.name)
}

// startWAN starts the WAN container: idemctl wan-proxy, on every network.
func (d *dockerEnv) startWAN(ctx context.Context, cfg *Config, log func(string) string) (*Process, error) {
	c := &container{d: d, name: "idem-" + d.id + "-wan", image: d.image, envFile: filepath.Join(d.stateDir, "secrets", "env-wan")}
	d.mu.Lock()
	for _, l := range d.netOrder {
		c.nets = append(c.nets, containerNet{logical: l, ip: d.nets[l].wanIP, wan: true})
	}
	api := fmt.Sprintf("%s:%d", d.nets[d.netOrder[0]].wanIP, dockerWANAPIPort)
	d.mu.Unlock()
	p := &Process{
		kind: KindWAN, name: "wan", path: cfg.IdemctlPath, ctr: c,
		argv: func(string) []string {
			return []string{"wan-proxy", "--listen", fmt.Sprintf("0.0.0.0:%d", dockerWANAPIPort)}
		},
		addr: api, readyPath: "/version", logPath: log("wan"),
		readyTimeout: cfg.ReadyTimeout, stopGrace: cfg.StopGrace, log: cfg.Logger, scheme: "http",
	}
	if err := firstStart(ctx, p); err != nil {
		return nil, err
	}
	for _, n := range c.nets[1:] {
		if _, err := d.run(ctx, "network", "connect", "--ip", n.ip, "--alias", wanAlias, d.nets[n.logical].name, c.name); err != nil {
			return nil, fmt.Errorf("cluster: the WAN container: %w", err)
		}
	}
	pid, err := d.run(ctx, "inspect", "--format", "{{.State.Pid}}", c.name)
	if err != nil {
		return nil, fmt.Errorf("cluster: the WAN container's process: %w", err)
	}
	if d.wanPid, err = strconv.Atoi(pid); err != nil {
		return nil, fmt.Errorf("cluster: the WAN container's process: %q: %w", pid, err)
	}
	d.wan = p
	return p, nil
}

// isolate drops (or stops dropping) every packet between the WAN and
// region's network, with iptables in the WAN container's network
// namespace: nothing is closed, reset or renumbered, packets just go
// nowhere, as in a real partition, and once it heals TCP resumes the
// connections that survived it.
func (d *dockerEnv) isolate(ctx context.Context, region string, on bool) error {
	return d.setRules(ctx, region, d.isolated, on, func(n *dockerNet) [][]string {
		subnet, comment := n.prefix+".0/24", "idem-isolate-"+region
		return [][]string{
			{"INPUT", "--source", subnet, "-m", "comment", "--comment", comment, "-j", "DROP"},
			{"OUTPUT", "--destination", subnet, "-m", "comment", "--comment", comment, "-j", "DROP"},
		}
	})
}

// cutOutbound adds (or deletes) the iptables rule, in the WAN container's
// network namespace, that drops every packet of a connection opened from
// region's network: the region reaches nobody, while connections opened
// into it (their packets from the region are replies) still work.
// Connections the region had opened before go silent, as with isolate.
func (d *dockerEnv) cutOutbound(ctx context.Context, region string, on bool) error {
	return d.setRules(ctx, region, d.cut, on, func(n *dockerNet) [][]string {
		return [][]string{{"INPUT", "--destination", n.wanIP, "-p", "tcp", "-m", "conntrack", "--ctdir", "ORIGINAL",
			"-m", "comment", "--comment", "idem-cut-" + region, "-j", "DROP"}}
	})
}

// setRules inserts (on) or deletes the rules of a region's fault, whose
// state (guarded by d.mu) says whether they are in place.
func (d *dockerEnv) setRules(ctx context.Context, region string, state map[string]bool, on bool, rules func(*dockerNet) [][]string) error {
	d.mu.Lock()
	n, ok := d.nets[region]
	known := slices.Contains(d.regions, region)
	was := state[region]
	d.mu.Unlock()
	if !ok || !known {
		return fmt.Errorf("cluster: no region %q", region)
	}
	if was == on {
		return nil
	}
	for _, rule := range rules(n) {
		if err := d.iptables(ctx, on, rule...); err != nil {
			return fmt.Errorf("cluster: region %s: %w", region, err)
		}
	}
	d.mu.Lock()
	state[region] = on
	d.mu.Unlock()
	return nil
}

// iptables inserts (on) or deletes a rule of the WAN container's network
// namespace, with the host's nsenter and iptables.
func (d *dockerEnv) iptables(ctx context.Context, on bool, rule ...string) error {
	op := "-I"
	if !on {
		op = "-D"
	}
	args := append([]string{"--target", strconv.Itoa(d.wanPid), "--net", "--", "iptables", op}, rule...)
	if out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("nsenter iptables %s: %w: %s (needs root, nsenter and iptables on the host)", strings.Join(rule, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// close removes every container and network of the cluster that is left,
// whether or not ctx has ended: nothing may stay behind.
func (d *dockerEnv) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var errs []error
	ids, err := d.run(ctx, "ps", "--all", "--quiet", "--filter", "label="+dockerLabel+"="+d.id)
	if err != nil {
		errs = append(errs, err)
	}
	if ids != "" {
		args := append([]string{"rm", "--force"}, strings.Fields(ids)...)
		if _, err := d.run(ctx, args...); err != nil {
			errs = append(errs, err)
		}
	}
	d.mu.Lock()
	var names []string
	for _, l := range d.netOrder {
		names = append(names, d.nets[l].name)
	}
	d.mu.Unlock()
	if len(names) > 0 {
		if _, err := d.run(ctx, append([]string{"network", "rm"}, names...)...); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startDocker creates the networks and starts the WAN container; the
// cluster's links are its proxies from then on.
func (c *Cluster) startDocker(ctx context.Context, cfg *Config) error {
	d, err := newDockerEnv(ctx, cfg, c.stateDir)
	if err != nil {
		return err
	}
	c.docker = d
	if err := d.createNetworks(ctx); err != nil {
		return err
	}
	wan, err := d.startWAN(ctx, cfg, c.logPath)
	if err != nil {
		return err
	}
	c.net = newNetwork(c.log)
	c.net.proxies = newRemoteProxies(wan.Addr())
	c.net.listenFor = d.listenFor
	c.log.Info("cluster: docker networks ready", "id", d.id, "wan", wan.Addr())
	return nil
}

// logPath is the log file of the process name.
func (c *Cluster) logPath(name string) string {
	return filepath.Join(c.stateDir, "logs", name+".log")
}

// startStoreDocker starts PostgreSQL in a container on the services
// network and returns its admin URL once it accepts connections.
func (c *Cluster) startStoreDocker(ctx context.Context, cfg *Config) (string, error) {
	var pw [16]byte
	if _, err := rand.Read(pw[:]); err != nil {
		return "", err
	}
	password := hex.EncodeToString(pw[:])
	ctr := c.docker.newContainer(KindStore, servicesNet, c.docker.pgImage)
	ctr.stopSignal = syscall.SIGINT
	addr := fmt.Sprintf("%s:%d", ctr.nets[0].ip, dockerPostgresPort)
	p := &Process{
		kind: KindStore, name: KindStore, ctr: ctr, addr: addr,
		argv: func(string) []string { return []string{"-c", "fsync=off", "-c", "max_connections=300"} },
		env:  []string{"POSTGRES_PASSWORD=" + password}, logPath: c.logPath(KindStore),
		readyTimeout: cfg.ReadyTimeout, stopGrace: cfg.StopGrace, log: c.log,
	}
	if err := p.start(); err != nil {
		return "", err
	}
	c.dockerStore = p
	admin := fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", password, addr)
	wctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(wctx, admin)
		if err == nil {
			_ = conn.Close(context.Background())
			c.log.Info("cluster: store ready", "addr", addr)
			return admin, nil
		}
		select {
		case <-p.Exited():
			return "", fmt.Errorf("cluster: the store container exited before it was ready\n%s", p.logTail(p.current()))
		case <-wctx.Done():
			return "", fmt.Errorf("cluster: the store container is not ready: %w (last: %v)\n%s", wctx.Err(), err, p.logTail(p.current()))
		case <-time.After(readyPoll):
		}
	}
}

// rejoinAll undoes every network-layer fault (before the cluster stops,
// so that nodes leave etcd promptly).
func (d *dockerEnv) rejoinAll(ctx context.Context) {
	for _, r := range d.regions {
		_ = d.cutOutbound(ctx, r, false)
		_ = d.isolate(ctx, r, false)
	}
}

// --- the Cluster's API ---

// Docker reports whether the cluster runs in the docker environment
// (Config.Docker).
func (c *Cluster) Docker() bool { return c.docker != nil }

// IsolateRegion cuts region off at the network layer: the WAN container
// drops every packet to or from the region's network, so every link between the region
// (its nodes and its etcd member) and the rest (etcd peers, the store, the
// provider, requests forwarded in either direction) fails at once, and
// open connections are not closed but go silent. RejoinRegion undoes it.
// It fails with ErrNotDocker outside the docker environment.
func (c *Cluster) IsolateRegion(ctx context.Context, region string) error {
	if c.docker == nil {
		return ErrNotDocker
	}
	if err := c.docker.isolate(ctx, region, true); err != nil {
		return err
	}
	c.log.Info("cluster: region isolated", "region", region)
	return nil
}

// RejoinRegion connects region's network to the WAN again, with the
// addresses it had.
func (c *Cluster) RejoinRegion(ctx context.Context, region string) error {
	if c.docker == nil {
		return ErrNotDocker
	}
	if err := c.docker.isolate(ctx, region, false); err != nil {
		return err
	}
	c.log.Info("cluster: region rejoined", "region", region)
	return nil
}

// CutOutbound makes a partition that goes one way: every connection the
// region's containers open to the WAN is dropped (new and open ones: their
// packets go nowhere), while connections the other regions open into the
// region still work. The region reaches nobody; everybody reaches it.
// on=false undoes it. It fails with ErrNotDocker outside the docker
// environment.
func (c *Cluster) CutOutbound(ctx context.Context, region string, on bool) error {
	if c.docker == nil {
		return ErrNotDocker
	}
	if err := c.docker.cutOutbound(ctx, region, on); err != nil {
		return err
	}
	c.log.Info("cluster: outbound connections of a region", "region", region, "cut", on)
	return nil
}

// Container returns the name of the process's container in the docker
// environment, "" outside it.
func (p *Process) Container() string {
	if p.ctr == nil {
		return ""
	}
	return p.ctr.name
}

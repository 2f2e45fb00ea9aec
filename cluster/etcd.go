package cluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idemcoord/idem/internal/freeport"
	"github.com/idemcoord/idem/routing"
)

const (
	// etcdDialTimeout bounds the cluster's own etcd client's connection
	// attempts.
	etcdDialTimeout = 5 * time.Second
	// etcdStatusTimeout bounds one member's Status call.
	etcdStatusTimeout = 2 * time.Second
	// etcdQuietTimeout bounds the wait, when the cluster stops, for the
	// leader to notice that its followers are gone.
	etcdQuietTimeout = 2 * time.Second
)

// etcdMember is an etcd member's configuration besides its Process.
type etcdMember struct {
	name      string // "m<i>", its etcd --name
	dataDir   string
	peerAddr  string // where it listens for peers
	advertise string // the peer address it advertises (a peerDemux when proxied)
	demux     *peerDemux
	cert, key string     // its certificate, with Config.TLS
	ctr       *container // its container, with Config.Docker
	region    string     // the region whose network it is on, with Config.Docker
}

// etcdTLSArgs makes member m serve clients and peers over TLS with its
// certificate and require certificates of the cluster's CA from both.
func etcdTLSArgs(m *etcdMember, t *clusterTLS) []string {
	ca := t.ca.CertFile
	return []string{
		"--cert-file", m.cert, "--key-file", m.key, "--client-cert-auth", "--trusted-ca-file", ca,
		"--peer-cert-file", m.cert, "--peer-key-file", m.key, "--peer-client-cert-auth", "--peer-trusted-ca-file", ca,
	}
}

// startEtcd starts cfg.EtcdMembers etcd members forming one new cluster in
// <state>/etcd (whatever was there is removed: the members' ports are new)
// and waits until every member answers GET /health; then it connects the
// cluster's client and checks the membership. A port taken before a member
// bound it restarts the whole etcd cluster on new ports.
func (c *Cluster) startEtcd(ctx context.Context, cfg *Config) error {
	root := filepath.Join(c.stateDir, "etcd")
	n := cfg.EtcdMembers
	members := make([]*etcdMember, n)
	for i := range members {
		members[i] = &etcdMember{name: fmt.Sprintf("m%d", i), dataDir: filepath.Join(root, fmt.Sprintf("m%d", i))}
	}
	if c.docker != nil {
		// Each member in a container of its own, on its region's network;
		// every member dials member j at wan:<port of j>.
		for i, m := range members {
			m.ctr = c.docker.newContainer("etcd-"+m.name, c.docker.netOf("etcd-"+m.name), c.docker.image)
			if i < len(cfg.Regions) {
				m.region = cfg.Regions[i]
			}
			m.advertise = fmt.Sprintf("%s:%d", wanAlias, dockerPeerPortBase+i)
		}
	} else if c.proxiesAll() {
		// One demultiplexer per member for its advertised peer URL; the
		// links between members are made once their ports are known.
		for _, m := range members {
			d, err := c.net.addPeerDemux("etcd-"+m.name, c.etcdOwners)
			if err != nil {
				return err
			}
			m.demux, m.advertise = d, d.addr()
		}
	}

	var token [8]byte
	if _, err := rand.Read(token[:]); err != nil {
		return fmt.Errorf("cluster: etcd cluster token: %w", err)
	}
	for attempt := 1; ; attempt++ {
		err := c.tryStartEtcd(ctx, cfg, root, members, fmt.Sprintf("idem-%s-%d", hex.EncodeToString(token[:]), attempt))
		if err == nil {
			break
		}
		c.killEtcd()
		if !errors.Is(err, errAddrInUse) || attempt == portAttempts || ctx.Err() != nil {
			return err
		}
		c.log.Info("cluster: an etcd port was taken, retrying on other ports", "err", err)
	}

	var endpoints []string
	for _, p := range c.etcd {
		endpoints = append(endpoints, p.URL())
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: etcdDialTimeout, Logger: zap.NewNop(), TLS: c.ClientTLS(),
	})
	if err != nil {
		return fmt.Errorf("cluster: etcd client: %w", err)
	}
	c.etcdClient = cli
	lctx, cancel := context.WithTimeout(ctx, etcdDialTimeout)
	defer cancel()
	resp, err := cli.MemberList(lctx)
	if err != nil {
		return fmt.Errorf("cluster: etcd member list: %w", err)
	}
	c.etcdIDs = map[uint64]*Process{}
	for _, m := range resp.Members {
		i := -1
		_, _ = fmt.Sscanf(m.Name, "m%d", &i)
		if i < 0 || i >= len(c.etcd) {
			return fmt.Errorf("cluster: etcd member list has an unexpected member %q", m.Name)
		}
		c.etcdIDs[m.ID] = c.etcd[i]
	}
	if len(c.etcdIDs) != n {
		return fmt.Errorf("cluster: etcd member list has %d members, want %d", len(c.etcdIDs), n)
	}
	return nil
}

// tryStartEtcd picks ports, starts every member of a new cluster and waits
// until all are healthy.
func (c *Cluster) tryStartEtcd(ctx context.Context, cfg *Config, root string, members []*etcdMember, token string) error {
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("cluster: remove old etcd data: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("cluster: etcd data directory: %w", err)
	}
	clientAddrs := make([]string, len(members))
	// The processes' client and peer ports, picked together so that no
	// two are one (freeport.Distinct).
	ports, err := freeport.Distinct(2 * len(members))
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	for i, m := range members {
		if m.ctr != nil {
			ip := m.ctr.nets[0].ip
			clientAddrs[i] = fmt.Sprintf("%s:%d", ip, dockerEtcdClient)
			m.peerAddr = fmt.Sprintf("%s:%d", ip, dockerEtcdPeer)
			continue
		}
		clientAddrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i]))
		m.peerAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i+1]))
		if m.demux == nil {
			m.advertise = m.peerAddr
		} else {
			m.demux.setDirect(m.peerAddr)
		}
	}
	if c.proxiesAll() {
		for _, from := range members {
			for _, to := range members {
				if from != to {
					if _, err := c.net.set("etcd-"+from.name, "etcd-"+to.name, to.peerAddr); err != nil {
						return err
					}
				}
			}
		}
	}
	initial := make([]string, len(members))
	for i, m := range members {
		initial[i] = m.name + "=" + c.scheme() + "://" + m.advertise
	}
	if c.tls != nil {
		for _, m := range members {
			if m.cert == "" {
				var err error
				if m.cert, m.key, err = c.tls.issue("etcd-"+m.name, nil); err != nil {
					return err
				}
			}
		}
	}
	env := nodeEnv(nil)
	procs := make([]*Process, len(members))
	for i, m := range members {
		args := []string{
			"--name", m.name,
			"--data-dir", m.dataDir,
			"--listen-client-urls", c.scheme() + "://" + clientAddrs[i],
			"--advertise-client-urls", c.scheme() + "://" + clientAddrs[i],
			"--listen-peer-urls", c.scheme() + "://" + m.peerAddr,
			"--initial-advertise-peer-urls", c.scheme() + "://" + m.advertise,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			// Like PostgreSQL's fsync=off: a killed member loses nothing
			// (the page cache survives it), only an OS crash would.
			"--unsafe-no-fsync",
		}
		if c.tls != nil {
			args = append(args, etcdTLSArgs(m, c.tls)...)
		}
		args = append(args, cfg.ExtraEtcdArgs...)
		procs[i] = &Process{
			kind:         KindEtcd,
			region:       m.region,
			ctr:          m.ctr,
			name:         "etcd-" + m.name,
			index:        i,
			path:         cfg.EtcdPath,
			argv:         func(string) []string { return args },
			env:          env,
			addr:         clientAddrs[i],
			readyPath:    "/health",
			logPath:      filepath.Join(c.stateDir, "logs", "etcd-"+m.name+".log"),
			readyTimeout: cfg.ReadyTimeout,
			stopGrace:    cfg.StopGrace,
			log:          c.log,
			scheme:       c.scheme(),
			tlsConfig:    c.ClientTLS(),
		}
	}
	c.mu.Lock()
	c.etcd = procs
	c.mu.Unlock()
	// A member is healthy only once a quorum has formed: start them all,
	// then wait.
	for _, p := range procs {
		if err := p.start(); err != nil {
			return err
		}
	}
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.WaitReady(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if errors.Is(err, errAddrInUse) {
			return err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, p := range procs {
		c.log.Info("cluster: etcd member ready", "member", p.Name(), "url", p.URL(), "pid", p.Pid())
	}
	return nil
}

// killEtcd kills every etcd member (after a failed start).
func (c *Cluster) killEtcd() {
	for _, p := range c.EtcdMembers() {
		_ = p.Kill()
	}
}

// etcdOwners maps the pid of every running etcd member to its name, for
// the peer demultiplexers.
func (c *Cluster) etcdOwners() map[int]string {
	out := map[int]string{}
	for _, p := range c.EtcdMembers() {
		if p.Running() {
			out[p.Pid()] = p.Name()
		}
	}
	return out
}

// EtcdMembers returns the etcd members, in index order (none without
// Config.EtcdMembers). Kill, Restart and Signal them like nodes: a
// restarted member rejoins with its data directory.
func (c *Cluster) EtcdMembers() []*Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Process(nil), c.etcd...)
}

// EtcdMember returns etcd member i (named etcd-m<i>), or nil.
func (c *Cluster) EtcdMember(i int) *Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.etcd) {
		return nil
	}
	return c.etcd[i]
}

// EtcdEndpoints returns the members' client URLs (http://127.0.0.1:PORT),
// as the cluster itself reaches them (nodes of a proxied cluster reach them
// through their own links instead).
func (c *Cluster) EtcdEndpoints() []string {
	out := []string{}
	for _, p := range c.EtcdMembers() {
		out = append(out, p.URL())
	}
	return out
}

// EtcdClient returns the cluster's own client of its etcd cluster (direct,
// never through a link), for example to move placements with package
// routing; nil without etcd. It is closed by Stop: do not close it.
func (c *Cluster) EtcdClient() *clientv3.Client { return c.etcdClient }

// EtcdLeader returns the member that currently leads the etcd cluster: the
// leader named by the reachable member with the highest raft term (during a
// partition, an isolated old leader may still believe it leads). It fails if
// no member answers or none knows a leader.
func (c *Cluster) EtcdLeader(ctx context.Context) (*Process, error) {
	leader, _, err := c.etcdStatus(ctx)
	if err != nil {
		return nil, err
	}
	p, ok := c.etcdIDs[leader]
	if !ok {
		return nil, fmt.Errorf("cluster: etcd leader %x is not a member the cluster started", leader)
	}
	return p, nil
}

// EtcdTerm returns the highest raft term a reachable member that knows a
// leader reports. It grows with every election: a drill compares it before
// and after a fault to tell whether etcd elected a leader meanwhile (which
// extends every lease by an election timeout).
func (c *Cluster) EtcdTerm(ctx context.Context) (uint64, error) {
	_, term, err := c.etcdStatus(ctx)
	return term, err
}

// etcdStatus asks every member for its status and returns the leader and
// term of the highest term among the members that know a leader.
func (c *Cluster) etcdStatus(ctx context.Context) (leader, term uint64, err error) {
	if c.etcdClient == nil {
		return 0, 0, errors.New("cluster: no etcd (Config.EtcdMembers is 0)")
	}
	var errs []error
	for _, p := range c.EtcdMembers() {
		sctx, cancel := context.WithTimeout(ctx, etcdStatusTimeout)
		st, err := c.etcdClient.Status(sctx, p.URL())
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			continue
		}
		if st.Leader != 0 && st.RaftTerm >= term {
			term, leader = st.RaftTerm, st.Leader
		}
	}
	if leader == 0 {
		return 0, 0, fmt.Errorf("cluster: no etcd member knows a leader: %w", errors.Join(errs...))
	}
	return leader, term, nil
}

// writePlacements stores the cluster's regions as the default region list
// (so a tenant never placed is homed by routing.DefaultHome, without a
// placement write on its first request), makes tenant i's home region i
// modulo the number of regions and returns tenant -> region.
func (c *Cluster) writePlacements(ctx context.Context, tenants, regions []string) (map[string]string, error) {
	if _, err := routing.SetDefaultRegions(ctx, c.etcdClient, regions); err != nil {
		return nil, fmt.Errorf("cluster: default regions: %w", err)
	}
	out := make(map[string]string, len(tenants))
	for i, t := range tenants {
		r := regions[i%len(regions)]
		if _, err := routing.SetPlacement(ctx, c.etcdClient, t, r); err != nil {
			return nil, fmt.Errorf("cluster: placement of %s: %w", t, err)
		}
		out[t] = r
	}
	return out, nil
}

// waitNoActivePeers waits, at most max, until etcd member p counts no
// active peer connection (its etcd_network_active_peers gauges are all 0).
// A leader stopped while it still counts a peer as active tries to hand its
// leadership over to it, and waits for etcd's request timeout (7s) when
// that peer is gone.
func (p *Process) waitNoActivePeers(ctx context.Context, max time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	client, release := p.probeClient()
	defer release()
	for {
		if n, err := activePeers(ctx, client, p.URL()+"/metrics"); err != nil || n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(readyPoll):
		}
	}
}

// activePeers sums the etcd_network_active_peers gauges of a member's
// metrics.
func activePeers(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "etcd_network_active_peers{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			n += int(v)
		}
	}
	return n, sc.Err()
}

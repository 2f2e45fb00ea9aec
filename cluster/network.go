package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// Endpoint names that links use besides node names ("<region>-<i>") and
// etcd member names ("etcd-m<i>").
const (
	EndpointStore    = "store"
	EndpointProvider = "provider"
	// EndpointEffects is the database where consumer effects are claimed
	// across regions (region-local store mode).
	EndpointEffects = "effects"
)

// ErrNotProxied is returned by the network methods of a cluster started
// without Config.Proxied.
var ErrNotProxied = errors.New("cluster: the cluster's links are not proxied (Config.Proxied is false)")

// Link is one network path of a proxied cluster (Config.Proxied): a TCP
// proxy of the cluster's in-process toxiproxy server, named "<from>-><to>".
//
//	<node>->store        the node's connections to PostgreSQL
//	<node>->etcd-m<j>    the node's connections to etcd member j
//	<node>->provider     the node's connections to the provider simulator
//	<node>->effects      the node's connections to the effects database
//	-><node>             every connection into the node: requests other
//	                     regions forward to it (its --advertise-url)
//	etcd-m<i>->etcd-m<j> member i's connections to member j's peer port
//
// Nodes are named "<region>-<index>". A partitioned link refuses new
// connections and drops the open ones, in both directions.
type Link struct {
	// Name is "<from>-><to>".
	Name string `json:"name"`
	// From is the endpoint that opens the connections; "" for a node's
	// ingress link.
	From string `json:"from"`
	// To is the endpoint connected to.
	To string `json:"to"`
	// Listen is the proxy's address, 127.0.0.1:PORT, which From uses
	// (etcd members through the demultiplexer at To's advertised peer URL,
	// see peerDemux).
	Listen string `json:"listen"`
	// Upstream is the real address of To.
	Upstream string `json:"upstream"`
}

// Toxic describes a toxiproxy toxic (see the toxiproxy documentation for
// the types and their attributes: latency, bandwidth, slow_close, timeout,
// reset_peer, slicer, limit_data).
type Toxic struct {
	// Name identifies the toxic on its link. Default: "<type>_<stream>".
	Name string `json:"name,omitempty"`
	// Type is the toxic's type, such as "latency" or "reset_peer".
	Type string `json:"type"`
	// Stream is "downstream" (data from To back to From, the default) or
	// "upstream" (data from From to To).
	Stream string `json:"stream,omitempty"`
	// Toxicity is the probability that the toxic applies to a connection.
	// Default (0): 1, always.
	Toxicity float32 `json:"toxicity"`
	// Attributes are the type's attributes, for example {"latency": 100,
	// "jitter": 10} (milliseconds) for latency.
	Attributes map[string]any `json:"attributes,omitempty"`
}

// network is the toxiproxy server of a proxied cluster (in this process,
// or in the docker environment's WAN container) and the links it carries.
type network struct {
	log     *slog.Logger
	proxies proxies
	// listenFor is the address the proxy of link from->to listens on
	// (port 0: any free port).
	listenFor func(from, to string) string

	mu      sync.Mutex
	links   map[string]*netLink
	order   []string // link names in creation order
	demuxes []*peerDemux
}

type netLink struct {
	Link
	partitioned bool
}

func newNetwork(log *slog.Logger) *network {
	return &network{
		log:       log,
		proxies:   newLocalProxies(),
		listenFor: func(string, string) string { return "127.0.0.1:0" },
		links:     map[string]*netLink{},
	}
}

// set creates and starts the proxy from->to. If the link exists already
// (its upstream moved to another port during startup), its proxy is
// replaced by a new one, on a new port (in this process): stopping and
// restarting a proxy on its port would leave the port free for a moment,
// for anyone to take.
func (n *network) set(from, to, upstream string) (Link, error) {
	name := from + "->" + to
	n.mu.Lock()
	defer n.mu.Unlock()
	old, exists := n.links[name]
	listen, err := n.proxies.create(name, n.listenFor(from, to), upstream)
	if err != nil {
		return Link{}, err
	}
	// The proxy listens there again after a partition heals.
	l := &netLink{Link: Link{Name: name, From: from, To: to, Listen: listen, Upstream: upstream}}
	n.links[name] = l
	if !exists {
		n.order = append(n.order, name)
	} else if old.partitioned {
		if err := n.proxies.stop(name); err != nil {
			return Link{}, err
		}
		l.partitioned = true
	}
	return l.Link, nil
}

// listen returns the current address of link name ("" if there is none).
func (n *network) listen(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l, ok := n.links[name]; ok {
		return l.Listen
	}
	return ""
}

// getLocked returns the links named, or an error naming those that do not
// exist. The caller holds n.mu.
func (n *network) getLocked(names []string) ([]*netLink, error) {
	out := make([]*netLink, 0, len(names))
	var missing []string
	for _, name := range names {
		if l, ok := n.links[name]; ok {
			out = append(out, l)
		} else {
			missing = append(missing, strconv.Quote(name))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("cluster: no link %s (see Cluster.Links)", strings.Join(missing, ", "))
	}
	return out, nil
}

// lockLinks locks the network and looks up links by name; the caller runs
// unlock when done with them (nothing is held when err is set).
func (n *network) lockLinks(names []string) (links []*netLink, unlock func(), err error) {
	n.mu.Lock()
	links, err = n.getLocked(names)
	if err != nil {
		n.mu.Unlock()
		return nil, nil, err
	}
	return links, n.mu.Unlock, nil
}

func (n *network) linkList() []Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Link, 0, len(n.order))
	for _, name := range n.order {
		out = append(out, n.links[name].Link)
	}
	return out
}

func (n *network) partition(names []string) error {
	links, unlock, err := n.lockLinks(names)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, l := range links {
		// Closes the listener and every open connection.
		if err := n.proxies.stop(l.Name); err != nil {
			errs = append(errs, fmt.Errorf("cluster: partition %s: %w", l.Name, err))
			continue
		}
		l.partitioned = true
	}
	n.log.Info("cluster: partitioned", "links", names)
	return errors.Join(errs...)
}

func (n *network) heal(names []string) error {
	links, unlock, err := n.lockLinks(names)
	if err != nil {
		return err
	}
	defer unlock()
	var (
		errs   []error
		healed []string
	)
	for _, l := range links {
		if !l.partitioned {
			continue
		}
		if err := n.proxies.start(l.Name); err != nil {
			errs = append(errs, fmt.Errorf("cluster: heal %s: listen on %s again: %w", l.Name, l.Listen, err))
			continue
		}
		l.partitioned = false
		healed = append(healed, l.Name)
	}
	if len(healed) > 0 {
		n.log.Info("cluster: healed", "links", healed)
	}
	return errors.Join(errs...)
}

func (n *network) allNames() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.order...)
}

func (n *network) addToxic(name string, t Toxic) error {
	links, unlock, err := n.lockLinks([]string{name})
	if err != nil {
		return err
	}
	defer unlock()
	if t.Toxicity == 0 {
		t.Toxicity = 1
	}
	if t.Stream == "" {
		t.Stream = "downstream"
	}
	if err := n.proxies.addToxic(links[0].Name, t); err != nil {
		return fmt.Errorf("cluster: add %s toxic to %s: %w", t.Type, name, err)
	}
	return nil
}

func (n *network) removeToxic(link, toxic string) error {
	links, unlock, err := n.lockLinks([]string{link})
	if err != nil {
		return err
	}
	defer unlock()
	if err := n.proxies.removeToxic(links[0].Name, toxic); err != nil {
		return fmt.Errorf("cluster: remove toxic %s from %s: %w", toxic, link, err)
	}
	return nil
}

func (n *network) removeToxics(names []string) error {
	links, unlock, err := n.lockLinks(names)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, l := range links {
		if err := n.proxies.resetToxics(l.Name); err != nil {
			errs = append(errs, fmt.Errorf("cluster: remove the toxics of %s: %w", l.Name, err))
		}
	}
	return errors.Join(errs...)
}

// close stops every proxy and demultiplexer, closing their connections.
func (n *network) close() {
	n.mu.Lock()
	demuxes := n.demuxes
	n.demuxes = nil
	n.mu.Unlock()
	for _, d := range demuxes {
		d.close()
	}
	n.proxies.close()
}

// --- the Cluster's API ---

// Links returns every link of a proxied cluster in creation order (etcd
// peer links, then each node's), or nil if Config.Proxied is false.
func (c *Cluster) Links() []Link {
	if c.net == nil {
		return nil
	}
	return c.net.linkList()
}

// Partition cuts the links named: their proxies stop listening and drop
// every open connection, so both directions fail at once (connections are
// refused until Heal). Partitioning a partitioned link does nothing. It
// fails, changing nothing, if a name is unknown.
func (c *Cluster) Partition(links ...string) error {
	if c.net == nil {
		return ErrNotProxied
	}
	return c.net.partition(links)
}

// Heal restores the links named (their proxies listen again on the same
// ports); with no name it heals every link. Toxics stay (see RemoveToxics).
func (c *Cluster) Heal(links ...string) error {
	if c.net == nil {
		return ErrNotProxied
	}
	if len(links) == 0 {
		links = c.net.allNames()
	}
	return c.net.heal(links)
}

// AddLatency delays the data of link in both directions by latency, plus or
// minus jitter, so that a request and its answer take about 2×latency
// longer. It replaces an earlier AddLatency of the link. Latency is applied
// with millisecond resolution.
func (c *Cluster) AddLatency(link string, latency, jitter time.Duration) error {
	if c.net == nil {
		return ErrNotProxied
	}
	for _, stream := range []string{"upstream", "downstream"} {
		name := "latency_" + stream
		if err := c.net.removeToxic(link, name); err != nil && !errors.Is(err, toxiproxy.ErrToxicNotFound) {
			return err
		}
		err := c.net.addToxic(link, Toxic{Name: name, Type: "latency", Stream: stream, Attributes: map[string]any{
			"latency": latency.Milliseconds(), "jitter": jitter.Milliseconds(),
		}})
		if err != nil {
			return err
		}
	}
	return nil
}

// AddToxic adds a toxiproxy toxic to link, for faults AddLatency and
// Partition do not cover (for example "timeout" or "reset_peer").
func (c *Cluster) AddToxic(link string, t Toxic) error {
	if c.net == nil {
		return ErrNotProxied
	}
	return c.net.addToxic(link, t)
}

// RemoveToxics removes every toxic (latency included) from the links named.
func (c *Cluster) RemoveToxics(links ...string) error {
	if c.net == nil {
		return ErrNotProxied
	}
	return c.net.removeToxics(links)
}

// LinksOf returns the names of every link touching a node of region, in
// both directions: each node's links to the store, to every etcd member and
// to the provider, and its ingress link (requests forwarded into the
// region). Partitioning them all cuts the region off. Nil if the cluster is
// not proxied or has no such region.
func (c *Cluster) LinksOf(region string) []string {
	var nodes []string
	for _, r := range c.regions {
		if r.name == region {
			for _, p := range r.nodes {
				nodes = append(nodes, p.Name())
			}
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	return c.LinksTouching(nodes...)
}

// proxiesAll reports whether every link of the cluster goes through its
// proxy: Config.Proxied without ProxiedStoreOnly. The replicated store's
// links are proxied whenever net is set.
func (c *Cluster) proxiesAll() bool { return c.net != nil && !c.storeLinks }

// LinksTouching returns the names of every link from or to one of the
// endpoints named: nodes ("eu-west-0"), etcd members ("etcd-m1"),
// EndpointStore or EndpointProvider. LinksTouching("etcd-m1") is every peer
// link of member 1 plus the nodes' links to it.
func (c *Cluster) LinksTouching(endpoints ...string) []string {
	want := map[string]bool{}
	for _, e := range endpoints {
		want[e] = true
	}
	var out []string
	for _, l := range c.Links() {
		if want[l.From] || want[l.To] {
			out = append(out, l.Name)
		}
	}
	return out
}

// --- etcd peer links ---

// etcd members must agree on each other's peer URLs (they are part of the
// membership, and of the member IDs), so member j advertises one URL that
// every other member dials. To give each ordered pair of members its own
// link, that URL is a peerDemux: it finds out which member opened each
// connection (the process holding the other end of the TCP connection, from
// /proc) and relays it through the link "etcd-m<i>->etcd-m<j>" to j's real
// peer port. A connection whose origin it cannot tell goes straight to the
// peer port.
type peerDemux struct {
	n      *network
	to     string // "etcd-m<j>"
	ln     net.Listener
	owners func() map[int]string // pid -> member name of the running members

	mu     sync.Mutex
	direct string // j's real peer address
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// addPeerDemux listens on a free port for member to's peer connections.
func (n *network) addPeerDemux(to string, owners func() map[int]string) (*peerDemux, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cluster: peer listener for %s: %w", to, err)
	}
	d := &peerDemux{n: n, to: to, ln: ln, owners: owners, conns: map[net.Conn]struct{}{}}
	n.mu.Lock()
	n.demuxes = append(n.demuxes, d)
	n.mu.Unlock()
	d.wg.Go(d.serve)
	return d, nil
}

func (d *peerDemux) addr() string { return d.ln.Addr().String() }

func (d *peerDemux) setDirect(addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.direct = addr
}

func (d *peerDemux) serve() {
	for {
		conn, err := d.ln.Accept()
		if err != nil {
			return
		}
		if !d.track(conn) {
			_ = conn.Close()
			return
		}
		d.wg.Go(func() { d.relay(conn) })
	}
}

// track registers an open connection; false once the demux is closed.
func (d *peerDemux) track(conn net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.conns[conn] = struct{}{}
	return true
}

func (d *peerDemux) untrack(conn net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.conns, conn)
}

// relay connects conn to its link's proxy and copies both ways until
// either side closes.
func (d *peerDemux) relay(conn net.Conn) {
	defer d.untrack(conn)
	defer conn.Close()
	target := d.target(conn)
	if target == "" {
		return
	}
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return // a partitioned link refuses connections
	}
	if !d.track(up) {
		_ = up.Close()
		return
	}
	defer d.untrack(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
	<-done
	_ = up.Close()
	_ = conn.Close()
	<-done
}

// target is the address conn is relayed to: its link's proxy, or the
// member's peer port when the origin is unknown.
func (d *peerDemux) target(conn net.Conn) string {
	d.mu.Lock()
	direct := d.direct
	d.mu.Unlock()
	local, err1 := netip.ParseAddrPort(conn.LocalAddr().String())
	remote, err2 := netip.ParseAddrPort(conn.RemoteAddr().String())
	if err1 != nil || err2 != nil {
		return direct
	}
	owners := d.owners()
	pids := make([]int, 0, len(owners))
	for pid := range owners {
		pids = append(pids, pid)
	}
	pid, err := socketOwner(remote, local, pids)
	if errors.Is(err, errOrphan) {
		return "" // the other end has closed already: nothing to relay
	}
	if err != nil {
		d.n.log.Warn("cluster: peer connection of unknown origin goes straight to the member", "to", d.to, "from", remote, "err", err)
		return direct
	}
	if listen := d.n.listen(owners[pid] + "->" + d.to); listen != "" {
		return listen
	}
	return direct
}

func (d *peerDemux) close() {
	d.mu.Lock()
	d.closed = true
	_ = d.ln.Close()
	for c := range d.conns {
		_ = c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

package region_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// cluster is two regions of one node each: eu-west, home of tenant-a, and
// us-east, which forwards tenant-a's requests there.
type fwdCluster struct {
	t      *testing.T
	etcd   *etcdtest.Server
	cli    *clientv3.Client
	ca     *tlsutil.CA
	dir    string
	client *http.Client // trusts the CA, presents no certificate
}

func newFwdCluster(t *testing.T, withTLS bool) *fwdCluster {
	t.Helper()
	etcd := etcdtest.Start(t)
	c := &fwdCluster{t: t, etcd: etcd, cli: etcd.Client(t), dir: t.TempDir()}
	if _, err := routing.SetPlacement(context.Background(), c.cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	if withTLS {
		var err error
		if c.ca, err = tlsutil.NewCA(c.dir, "test CA"); err != nil {
			t.Fatal(err)
		}
		tr.TLSClientConfig = tlsutil.ClientConfig(c.pool(), nil)
	}
	t.Cleanup(tr.CloseIdleConnections)
	c.client = &http.Client{Transport: tr}
	return c
}

func (c *fwdCluster) pool() *tlsutil.Pool {
	p, err := tlsutil.NewPool(c.ca.CertFile)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// issue makes a certificate for 127.0.0.1 naming peer (none when peer is
// zero).
func (c *fwdCluster) issue(name string, peer routing.Peer) *tlsutil.Reloader {
	c.t.Helper()
	leaf := tlsutil.Leaf{Name: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	if peer.Node != "" {
		leaf.URIs = []*url.URL{peer.URI()}
	}
	cert, key, err := c.ca.Issue(c.dir, leaf)
	if err != nil {
		c.t.Fatal(err)
	}
	r, err := tlsutil.NewReloader(cert, key)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

type fwdNode struct {
	url   string
	store *store.Store
	srv   *region.Server
}

// start starts node <region>-0 with cfg's peer settings, joined in etcd.
func (c *fwdCluster) start(regionName string, cfg region.Config) *fwdNode {
	t := c.t
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http://"
	if cfg.TLS != nil {
		scheme = "https://"
	}
	nodeID := regionName + "-0"
	m, err := routing.NewMap(ctx, c.cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	mem, err := routing.Join(ctx, c.cli, regionName, nodeID, scheme+ln.Addr().String(), 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close(context.Background()) })
	st, _ := storetest.New(t)
	pay := payments.NewService(st, payments.Config{Region: regionName, Window: time.Hour})
	cfg.Listener, cfg.Region, cfg.NodeID = ln, regionName, nodeID
	cfg.Tokens = map[string]string{"tok-a": "tenant-a"}
	cfg.Router = routing.NewRouter(c.cli, m, mem, routing.RouterConfig{Region: regionName, Window: time.Hour})
	srv, err := region.NewServer(cfg, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	// Both nodes must see each other before the test sends anything.
	waitUntil(t, "the map lists both regions", func() bool {
		return len(m.NodeList("eu-west")) > 0 && (regionName == "eu-west" || len(m.NodeList(regionName)) > 0)
	})
	return &fwdNode{url: srv.URL(), store: st, srv: srv}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// send posts a payment of tenant-a with key and extra headers.
func (c *fwdCluster) send(url, key string, headers map[string]string) answer {
	c.t.Helper()
	return sendWith(c.t, c.client, url, key, headers)
}

func sendWith(t *testing.T, client *http.Client, url, key string, headers map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(article))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func records(t *testing.T, n *fwdNode) int {
	return storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`)
}

// TestClientForwardedByRefused: a client's Idem-Forwarded-By, whatever its
// hop count, is refused with 403 FORWARDING_NOT_AUTHENTICATED and stores
// nothing anywhere; the answer echoes neither the header nor the home
// region. (It used to be forwarded on with hops=-6.)
func TestClientForwardedByRefused(t *testing.T) {
	c := newFwdCluster(t, false)
	secret := []byte("s3cret-peer")
	eu := c.start("eu-west", region.Config{PeerSecret: secret})
	us := c.start("us-east", region.Config{PeerSecret: secret})
	for i, h := range []string{"x; hops=-7", "ap-south/x; hops=1", "eu-west/eu-west-0; hops=1", "", "x"} {
		for _, n := range []*fwdNode{eu, us} {
			a := c.send(n.url, "fwd-"+string(rune('a'+i)), map[string]string{region.HeaderForwardedBy: h, region.HeaderTenant: "tenant-a"})
			if a.status != http.StatusForbidden || a.code() != idem.ECodeForwardingNotAuthenticated {
				t.Errorf("%s with %q: %d %s, want 403 %s", n.url, h, a.status, a.body, idem.ECodeForwardingNotAuthenticated)
			}
			if h != "" && strings.Contains(string(a.body), h) || strings.Contains(string(a.body), "eu-west") {
				t.Errorf("the answer echoes the header or the home region: %s", a.body)
			}
		}
	}
	// A wrong secret is no better.
	a := c.send(us.url, "wrong-secret", map[string]string{region.HeaderForwardedBy: "eu-west/eu-west-0; hops=1",
		region.HeaderTenant: "tenant-a", region.HeaderPeerSecret: "guess"})
	if a.status != http.StatusForbidden {
		t.Errorf("wrong peer secret: %d %s", a.status, a.body)
	}
	if n := records(t, eu) + records(t, us); n != 0 {
		t.Errorf("%d records stored for refused requests", n)
	}
}

// TestForwardingWithPeerSecret: without TLS, nodes sharing the peer secret
// forward to each other; the home node gets the tenant from the forwarder,
// never the client's token; a forwarded request that would hop again gets
// 508 without naming the home region; a node with no peer secret neither
// accepts nor makes forwarded requests.
func TestForwardingWithPeerSecret(t *testing.T) {
	c := newFwdCluster(t, false)
	secret := []byte("s3cret-peer")
	eu := c.start("eu-west", region.Config{PeerSecret: secret})
	us := c.start("us-east", region.Config{PeerSecret: secret})

	a := c.send(us.url, "forwarded", nil)
	if a.status != http.StatusCreated {
		t.Fatalf("forwarded payment: %d %s", a.status, a.body)
	}
	if records(t, eu) != 1 || records(t, us) != 0 {
		t.Errorf("records: home %d, forwarder %d; want 1, 0", records(t, eu), records(t, us))
	}

	// An authenticated peer's request that us-east would forward again.
	a = c.send(us.url, "loop", map[string]string{"Authorization": "", region.HeaderForwardedBy: "eu-west/eu-west-0; hops=1",
		region.HeaderTenant: "tenant-a", region.HeaderPeerSecret: string(secret)})
	if a.status != http.StatusLoopDetected || a.code() != idem.ECodeRoutingLoop || strings.Contains(string(a.body), "eu-west") {
		t.Errorf("second hop: %d %s, want 508 %s without the home region", a.status, a.body, idem.ECodeRoutingLoop)
	}
	// Well-formed, but a hop count no node sends.
	a = c.send(eu.url, "hops", map[string]string{region.HeaderForwardedBy: "us-east/us-east-0; hops=-7",
		region.HeaderTenant: "tenant-a", region.HeaderPeerSecret: string(secret)})
	if a.status != http.StatusForbidden {
		t.Errorf("hops=-7 from a peer: %d %s, want 403", a.status, a.body)
	}
}

// TestNodeWithoutPeerCredentials: a node with neither mTLS nor a peer
// secret refuses forwarded requests and does not forward.
func TestNodeWithoutPeerCredentials(t *testing.T) {
	c := newFwdCluster(t, false)
	eu := c.start("eu-west", region.Config{})
	us := c.start("us-east", region.Config{})
	if a := c.send(us.url, "k", nil); a.status != http.StatusServiceUnavailable || a.code() != idem.ECodeNotHome {
		t.Errorf("forwarding without credentials: %d %s, want 503 %s", a.status, a.body, idem.ECodeNotHome)
	}
	if a := c.send(eu.url, "k2", map[string]string{region.HeaderForwardedBy: "us-east/us-east-0; hops=1",
		region.HeaderTenant: "tenant-a", region.HeaderPeerSecret: ""}); a.status != http.StatusForbidden {
		t.Errorf("forwarded request to a node without credentials: %d %s, want 403", a.status, a.body)
	}
}

// mtlsConfig is a node's TLS configuration in the test cluster.
func (c *fwdCluster) mtlsConfig(peer routing.Peer) region.Config {
	cert := c.issue(peer.Node, peer)
	pool := c.pool()
	return region.Config{TLS: tlsutil.ServerConfig(cert, pool), PeerCAs: pool, PeerCert: cert}
}

// TestForwardingOverMutualTLS: nodes forward over HTTPS with client
// certificates; the home node accepts the forwarded request from the
// certificate, not from any header a client can send.
func TestForwardingOverMutualTLS(t *testing.T) {
	c := newFwdCluster(t, true)
	euPeer, usPeer := routing.Peer{Region: "eu-west", Node: "eu-west-0"}, routing.Peer{Region: "us-east", Node: "us-east-0"}
	eu := c.start("eu-west", c.mtlsConfig(euPeer))
	us := c.start("us-east", c.mtlsConfig(usPeer))
	if !strings.HasPrefix(eu.url, "https://") {
		t.Fatalf("node URL %s is not https", eu.url)
	}
	if a := c.send(us.url, "over-tls", nil); a.status != http.StatusCreated {
		t.Fatalf("forwarded payment: %d %s", a.status, a.body)
	}
	if records(t, eu) != 1 {
		t.Errorf("home records: %d, want 1", records(t, eu))
	}

	// A client with a certificate of the CA that names no node, or one
	// that names another node than its header says, is not a peer.
	clientCert := c.issue("client", routing.Peer{})
	usCert := c.issue("us-east-0-again", usPeer)
	for name, cert := range map[string]*tlsutil.Reloader{"no identity": clientCert, "other identity": usCert} {
		tr := &http.Transport{TLSClientConfig: tlsutil.ClientConfig(c.pool(), cert)}
		a := sendWith(t, &http.Client{Transport: tr}, eu.url, "impostor-"+name, map[string]string{
			region.HeaderForwardedBy: "ap-south/ap-south-0; hops=1", region.HeaderTenant: "tenant-a"})
		tr.CloseIdleConnections()
		if a.status != http.StatusForbidden || a.code() != idem.ECodeForwardingNotAuthenticated {
			t.Errorf("%s: %d %s, want 403", name, a.status, a.body)
		}
	}
}

// TestForwarderVerifiesTargetIdentity: whoever can write a node key in etcd
// cannot receive forwarded requests: a server with a certificate of the
// cluster's CA that names another node, registered as the home region's
// node, is never sent the request.
func TestForwarderVerifiesTargetIdentity(t *testing.T) {
	c := newFwdCluster(t, true)

	var reached atomic.Int32
	rogue := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), TLSConfig: tlsutil.ServerConfig(c.issue("rogue", routing.Peer{Region: "ap-south", Node: "ap-south-0"}), nil)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = rogue.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = rogue.Close() })
	val, _ := json.Marshal(map[string]string{"url": "https://" + ln.Addr().String()})
	if _, err := c.cli.Put(context.Background(), routing.NodeKey("eu-west", "eu-west-0"), string(val)); err != nil {
		t.Fatal(err)
	}
	// The same for a plain-HTTP registration: no downgrade.
	val, _ = json.Marshal(map[string]string{"url": "http://" + ln.Addr().String()})
	if _, err := c.cli.Put(context.Background(), routing.NodeKey("eu-west", "eu-west-1"), string(val)); err != nil {
		t.Fatal(err)
	}
	us := c.start("us-east", c.mtlsConfig(routing.Peer{Region: "us-east", Node: "us-east-0"}))
	for i := range 6 {
		a := c.send(us.url, "rogue-"+string(rune('a'+i)), nil)
		if a.status < 500 {
			t.Errorf("forwarded to an unverified target: %d %s", a.status, a.body)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the rogue target received %d requests", n)
	}
}

// TestForwardingStripsBearerToken: the node a request is forwarded to
// receives the tenant from the forwarder, never the client's bearer token.
func TestForwardingStripsBearerToken(t *testing.T) {
	c := newFwdCluster(t, false)
	got := make(chan http.Header, 1)
	home := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Clone():
		default:
		}
		w.WriteHeader(http.StatusCreated)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = home.Serve(ln) }()
	t.Cleanup(func() { _ = home.Close() })
	val, _ := json.Marshal(map[string]string{"url": "http://" + ln.Addr().String()})
	if _, err := c.cli.Put(context.Background(), routing.NodeKey("eu-west", "eu-west-0"), string(val)); err != nil {
		t.Fatal(err)
	}
	us := c.start("us-east", region.Config{PeerSecret: []byte("s3cret-peer")})
	if a := c.send(us.url, "strip", map[string]string{region.HeaderTenant: "someone-else"}); a.status != http.StatusCreated {
		t.Fatalf("forwarded: %d %s", a.status, a.body)
	}
	h := <-got
	if h.Get("Authorization") != "" || h.Get(region.HeaderTenant) != "tenant-a" ||
		h.Get(region.HeaderForwardedBy) != "us-east/us-east-0; hops=1" || h.Get(region.HeaderPeerSecret) != "s3cret-peer" {
		t.Errorf("the home node received Authorization %q, %s %q, %s %q, secret %q",
			h.Get("Authorization"), region.HeaderTenant, h.Get(region.HeaderTenant),
			region.HeaderForwardedBy, h.Get(region.HeaderForwardedBy), h.Get(region.HeaderPeerSecret))
	}
}

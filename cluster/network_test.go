package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/cluster"
)

// TestNetwork runs a proxied cluster: every link has its own proxy, a
// forwarded request crosses them, a node cut off from the store is not
// ready until the link heals, latency slows a link down, and an etcd
// member cut off from its peers loses the leadership.
func TestNetwork(t *testing.T) {
	c := startCluster(t, cluster.Config{
		Regions:     []string{"eu-west", "us-east"},
		EtcdMembers: 3,
		Provider:    true,
		Proxied:     true,
	})
	info := c.Info()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Every link, named <from>-><to>.
	var want []string
	for _, from := range []string{"m0", "m1", "m2"} {
		for _, to := range []string{"m0", "m1", "m2"} {
			if from != to {
				want = append(want, "etcd-"+from+"->etcd-"+to)
			}
		}
	}
	for _, n := range []string{"eu-west-0", "us-east-0"} {
		// ->effects: the database where the regions claim consumer effects.
		want = append(want, n+"->store", n+"->effects", n+"->etcd-m0", n+"->etcd-m1", n+"->etcd-m2", n+"->provider", "->"+n)
	}
	var names []string
	for _, l := range c.Links() {
		names = append(names, l.Name)
		if l.Name != l.From+"->"+l.To || !strings.HasPrefix(l.Listen, "127.0.0.1:") || l.Upstream == "" {
			t.Errorf("link %+v", l)
		}
	}
	if !sameStrings(names, want) {
		t.Errorf("links %q\nwant %q", names, want)
	}
	euLinks := []string{"eu-west-0->store", "eu-west-0->effects", "eu-west-0->etcd-m0", "eu-west-0->etcd-m1", "eu-west-0->etcd-m2", "eu-west-0->provider", "->eu-west-0"}
	if got := c.LinksOf("eu-west"); !sameStrings(got, euLinks) {
		t.Errorf("LinksOf(eu-west) = %q, want %q", got, euLinks)
	}
	if c.LinksOf("nowhere") != nil {
		t.Error("LinksOf an unknown region is not nil")
	}
	if err := c.Partition("eu-west-0->store", "no-such-link"); err == nil || !strings.Contains(err.Error(), "no-such-link") {
		t.Errorf("Partition of an unknown link: %v", err)
	}

	// A request for tenant-a (home eu-west) sent to us-east crosses
	// us-east-0->etcd-*, ->eu-west-0, eu-west-0->store and
	// eu-west-0->provider.
	token := info.Tokens["tenant-a"]
	away := c.Node("us-east", 0)
	if r := postPayment(t, away.URL(), token, "net-1", "invoice-net-1"); r.status != http.StatusCreated {
		t.Fatalf("forwarded POST through the proxies: %d %s", r.status, r.body)
	}

	// node -> store.
	home := c.Node("eu-west", 0)
	if err := c.Partition("eu-west-0->store"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	waitReadyz(ctx, t, home.URL(), http.StatusServiceUnavailable)
	t.Logf("eu-west-0 not ready %v after the partition", time.Since(began).Round(time.Millisecond))
	if err := c.Heal("eu-west-0->store"); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	waitReadyz(ctx, t, home.URL(), http.StatusOK)
	t.Logf("eu-west-0 ready %v after healing", time.Since(began).Round(time.Millisecond))

	// Latency on the link into eu-west-0 slows forwarded requests down.
	const latency = 150 * time.Millisecond
	if err := c.AddLatency("->eu-west-0", latency, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.AddLatency("->eu-west-0", latency, 10*time.Millisecond); err != nil { // replaces the first
		t.Fatalf("AddLatency again: %v", err)
	}
	began = time.Now()
	r := postPayment(t, away.URL(), token, "net-2", "invoice-net-2")
	slow := time.Since(began)
	if r.status != http.StatusCreated || slow < 2*latency-20*time.Millisecond {
		t.Errorf("forwarded POST with %v of latency each way: %d after %v", latency, r.status, slow)
	}
	if err := c.RemoveToxics("->eu-west-0"); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	r = postPayment(t, away.URL(), token, "net-3", "invoice-net-3")
	if fast := time.Since(began); r.status != http.StatusCreated || fast >= slow {
		t.Errorf("forwarded POST without latency: %d after %v (%v with it)", r.status, fast, slow)
	}

	// etcd: the leader cut off from its peers and the nodes loses its
	// leadership; the others elect a new leader and keep serving.
	leader, err := c.EtcdLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cut := c.LinksTouching(leader.Name())
	if len(cut) != 4+2 { // 2 peers both ways, 2 nodes
		t.Errorf("LinksTouching(%s) = %q", leader.Name(), cut)
	}
	t.Logf("isolating the etcd leader %s: %q", leader.Name(), cut)
	if err := c.Partition(cut...); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	newLeader := waitLeader(ctx, t, c, func(p *cluster.Process) bool { return p != leader })
	t.Logf("new leader %s after %v", newLeader.Name(), time.Since(began).Round(time.Millisecond))
	eventually(t, 30*time.Second, func() error {
		st, err := etcdStatus(ctx, c, leader)
		if err != nil {
			return err
		}
		if st.Leader != 0 {
			return fmt.Errorf("isolated member %s still follows or leads %x", leader.Name(), st.Leader)
		}
		return nil
	})
	if r := postUntilServed(ctx, t, away.URL(), token, "net-4", "invoice-net-4"); r.status != http.StatusCreated {
		t.Errorf("POST with the old etcd leader isolated: %d %s", r.status, r.body)
	}
	if err := c.Heal(); err != nil { // every link
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		cur, err := c.EtcdLeader(ctx)
		if err != nil {
			return err
		}
		curSt, err := etcdStatus(ctx, c, cur)
		if err != nil {
			return err
		}
		st, err := etcdStatus(ctx, c, leader)
		if err != nil {
			return err
		}
		if st.Leader != curSt.Header.MemberId {
			return fmt.Errorf("healed member %s follows %x, the leader %s is %x", leader.Name(), st.Leader, cur.Name(), curSt.Header.MemberId)
		}
		return nil
	})

	// A whole region cut off: its node loses the store, etcd and the
	// provider, and forwarded requests cannot reach it.
	if err := c.Partition(c.LinksOf("eu-west")...); err != nil {
		t.Fatal(err)
	}
	waitReadyz(ctx, t, home.URL(), http.StatusServiceUnavailable)
	if r := postPayment(t, away.URL(), token, "net-5", "invoice-net-5"); r.status < 500 {
		t.Errorf("POST for a tenant of a cut-off region: %d %s, want a 5xx", r.status, r.body)
	}
	if err := c.Heal(c.LinksOf("eu-west")...); err != nil {
		t.Fatal(err)
	}
	waitReadyz(ctx, t, home.URL(), http.StatusOK)
	if r := postUntilServed(ctx, t, away.URL(), token, "net-5", "invoice-net-5"); r.status != http.StatusCreated {
		t.Errorf("POST after healing the region: %d %s", r.status, r.body)
	}

	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
}

// waitReadyz polls GET /readyz until it answers status.
func waitReadyz(ctx context.Context, tb testing.TB, baseURL string, status int) {
	tb.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	eventually(tb, 30*time.Second, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != status {
			return fmt.Errorf("GET %s/readyz: %s, want %d", baseURL, resp.Status, status)
		}
		return nil
	})
}

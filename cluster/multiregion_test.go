package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/routing"
)

// TestMultiRegion runs two regions with their own databases, three etcd
// members and the provider: a payment sent to the tenant's other region is
// forwarded to its home region, stored there only, and answered exactly as
// a replay from the home region.
func TestMultiRegion(t *testing.T) {
	dir := stateDir(t)
	c := startCluster(t, cluster.Config{
		StateDir:        dir,
		Regions:         []string{"eu-west", "us-east"},
		EtcdMembers:     3,
		Provider:        true,
		UnplacedTenants: []string{"tenant-c"},
	})
	info := c.Info()

	// Info and cluster.json.
	if info.StoreMode != cluster.StoreRegionLocal {
		t.Errorf("storeMode %q, want %q", info.StoreMode, cluster.StoreRegionLocal)
	}
	if len(info.EtcdEndpoints) != 3 || !reflect.DeepEqual(info.EtcdEndpoints, c.EtcdEndpoints()) {
		t.Errorf("etcdEndpoints %q, want the 3 members' %q", info.EtcdEndpoints, c.EtcdEndpoints())
	}
	for i, p := range c.EtcdMembers() {
		if p.Name() != "etcd-m"+string(rune('0'+i)) || p.Kind() != cluster.KindEtcd || p.URL() != info.EtcdEndpoints[i] {
			t.Errorf("etcd member %d: %s (%s) at %s", i, p.Name(), p.Kind(), p.URL())
		}
		if _, err := os.Stat(filepath.Join(dir, "logs", p.Name()+".log")); err != nil {
			t.Errorf("etcd log: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "etcd", "m"+string(rune('0'+i)))); err != nil {
			t.Errorf("etcd data: %v", err)
		}
	}
	if info.ProviderURL == "" || info.ProviderURL != c.Provider().URL() {
		t.Errorf("providerUrl %q, provider process at %q", info.ProviderURL, c.Provider().URL())
	}
	if want := map[string]string{"tenant-a": "eu-west", "tenant-b": "us-east"}; !reflect.DeepEqual(info.Placements, want) {
		t.Errorf("placements %q, want %q", info.Placements, want)
	}
	if c.HomeRegion("tenant-a") != "eu-west" {
		t.Errorf("HomeRegion(tenant-a) = %q", c.HomeRegion("tenant-a"))
	}
	raw, err := os.ReadFile(c.StatePath())
	if err != nil {
		t.Fatal(err)
	}
	var onDisk cluster.Info
	if err := json.Unmarshal(raw, &onDisk); err != nil || !reflect.DeepEqual(onDisk, info) {
		t.Errorf("cluster.json (%v) = %+v, want Info %+v", err, onDisk, info)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	pc := &provider.Client{BaseURL: info.ProviderURL, AdminKey: info.ProviderAdminKey, HTTP: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	if err := pc.Healthy(ctx); err != nil {
		t.Errorf("provider: %v", err)
	}
	if len(info.ProviderAdminKey) < 16 || c.ProviderAdminKey() != info.ProviderAdminKey {
		t.Errorf("providerAdminKey %q (ProviderAdminKey %q), want a generated key", info.ProviderAdminKey, c.ProviderAdminKey())
	}

	home, away := info.Regions[0], info.Regions[1]
	token := info.Tokens["tenant-a"]
	fwd := postPayment(t, away.URL, token, "fwd-1", "invoice-fwd")
	if fwd.status != http.StatusCreated || fwd.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("POST to the non-home region: %d (replayed %q) %s, want a fresh 201", fwd.status, fwd.header.Get("Idempotent-Replayed"), fwd.body)
	}
	replay := postPayment(t, home.URL, token, "fwd-1", "invoice-fwd")
	if replay.status != http.StatusCreated || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay from the home region: %d, Idempotent-Replayed %q: %s", replay.status, replay.header.Get("Idempotent-Replayed"), replay.body)
	}
	if !bytes.Equal(replay.body, fwd.body) {
		t.Errorf("home region's replay:\n%s\nwant the forwarded answer byte for byte:\n%s", replay.body, fwd.body)
	}
	if again := postPayment(t, away.URL, token, "fwd-1", "invoice-fwd"); again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, fwd.body) {
		t.Errorf("replay through the non-home region: %d, Idempotent-Replayed %q: %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}

	// The nodes' admin API answers the admin token of cluster.json, on each
	// region's own store.
	admin, err := os.ReadFile(info.AdminTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []cluster.RegionInfo{home, away} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/v1/admin/records?tenant=tenant-a", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(admin)))
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), `"key":"fwd-1"`) != (r.Name == home.Name) {
			t.Errorf("%s's admin API: %d %s", r.Name, resp.StatusCode, b)
		}
	}

	// The payment lives in the home region's database only.
	for _, r := range info.Regions {
		want := 0
		if r.Name == "eu-west" {
			want = 1
		}
		records := countRows(ctx, t, r.DatabaseURL, `SELECT count(*) FROM idempotency_records WHERE tenant_id = 'tenant-a' AND idempotency_key = 'fwd-1'`)
		payments := countRows(ctx, t, r.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-a' AND merchant_reference = 'invoice-fwd'`)
		if records != want || payments != want {
			t.Errorf("region %s: %d record(s), %d payment(s); want %d of each", r.Name, records, payments, want)
		}
	}
	if counts, err := pc.Charges(ctx); err != nil || counts.Total != 1 {
		t.Errorf("provider charges: %+v, %v; want the one payment charged once", counts, err)
	}

	// tenant-b lives in us-east: the other way round.
	if r := postPayment(t, home.URL, info.Tokens["tenant-b"], "fwd-2", "invoice-fwd-2"); r.status != http.StatusCreated {
		t.Errorf("POST for tenant-b to eu-west: %d %s", r.status, r.body)
	}
	if n := countRows(ctx, t, away.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-b'`); n != 1 {
		t.Errorf("us-east has %d payment(s) of tenant-b, want 1", n)
	}

	// Start stores the regions as the default list: tenant-c, never
	// placed, is served at its default home, and its first request writes
	// no placement to etcd.
	if got, err := routing.GetDefaultRegions(ctx, c.EtcdClient()); err != nil || !reflect.DeepEqual(got, []string{"eu-west", "us-east"}) {
		t.Errorf("default regions %q (%v), want the cluster's regions", got, err)
	}
	if _, ok := info.Placements["tenant-c"]; ok || info.Tokens["tenant-c"] == "" {
		t.Errorf("tenant-c: placement %q, token %q; want a token and no placement", info.Placements["tenant-c"], info.Tokens["tenant-c"])
	}
	for i, r := range info.Regions {
		if res := postPayment(t, r.URL, info.Tokens["tenant-c"], fmt.Sprintf("dflt-%d", i), fmt.Sprintf("invoice-dflt-%d", i)); res.status != http.StatusCreated {
			t.Errorf("POST for the unplaced tenant-c to %s: %d %s", r.Name, res.status, res.body)
		}
	}
	if resp, err := c.EtcdClient().Get(ctx, routing.PlacementPrefix+"tenant-c"); err != nil {
		t.Errorf("placement key of tenant-c: %v", err)
	} else if len(resp.Kvs) != 0 {
		t.Errorf("placement key of tenant-c after its requests: %s (revision %d), want none", resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	}
	defaultHome := routing.DefaultHome("tenant-c", []string{"eu-west", "us-east"})
	for _, r := range info.Regions {
		want := 0
		if r.Name == defaultHome {
			want = 2
		}
		if n := countRows(ctx, t, r.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-c'`); n != want {
			t.Errorf("region %s has %d payment(s) of tenant-c, want %d (default home %s)", r.Name, n, want, defaultHome)
		}
	}

	// Without TLS the nodes authenticate forwarding with a private secret.
	if fi, err := os.Stat(filepath.Join(dir, cluster.PeerSecretFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("peer secret file: %v (mode %v), want 0600", err, fi.Mode().Perm())
	}
	if info.CAFile != "" || strings.Contains(string(raw), "caFile") {
		t.Errorf("a cluster without TLS names a CA: %q", info.CAFile)
	}

	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
}

// TestTLSCluster runs a proxied cluster with TLS on every link: https URLs
// and the CA in cluster.json, a payment forwarded over mutual TLS through
// the home node's ingress proxy, etcd that refuses clients without a
// certificate, and a node restarted on its certificate.
func TestTLSCluster(t *testing.T) {
	dir := stateDir(t)
	c := startCluster(t, cluster.Config{
		StateDir:    dir,
		Regions:     []string{"eu-west", "us-east"},
		EtcdMembers: 1,
		Provider:    true,
		Proxied:     true,
		TLS:         true,
	})
	info := c.Info()
	if info.CAFile == "" || info.CAFile != c.CAFile() {
		t.Fatalf("caFile %q, CAFile() %q", info.CAFile, c.CAFile())
	}
	urls := append([]string{info.ProviderURL}, info.EtcdEndpoints...)
	for _, r := range info.Regions {
		urls = append(urls, r.Nodes...)
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("%s is not https", u)
		}
	}
	for _, r := range info.Regions {
		if !strings.Contains(r.DatabaseURL, "sslmode=verify-full") {
			t.Errorf("region %s reaches its store at %s, want sslmode=verify-full", r.Name, r.DatabaseURL)
		}
	}
	keys, _ := filepath.Glob(filepath.Join(dir, cluster.TLSDir, "*-key.pem"))
	for _, k := range keys {
		if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", k, fi.Mode().Perm())
		}
	}
	if len(keys) < 6 { // CA, cluster, etcd member, provider, two nodes
		t.Errorf("key files %v", keys)
	}

	home, away := info.Regions[0], info.Regions[1]
	token := info.Tokens["tenant-a"]
	fwd := postPaymentTLS(t, c.ClientTLS(), away.URL, token, "tls-1", "invoice-tls")
	if fwd.status != http.StatusCreated {
		t.Fatalf("POST to the non-home region: %d %s", fwd.status, fwd.body)
	}
	if r := postPaymentTLS(t, c.ClientTLS(), home.URL, token, "tls-1", "invoice-tls"); r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, fwd.body) {
		t.Errorf("replay from the home region: %d %s", r.status, r.body)
	}

	// etcd wants a client certificate: trusting its CA is not enough.
	noCert := c.ClientTLS()
	noCert.GetClientCertificate = nil
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: noCert}, Timeout: 10 * time.Second}
	if resp, err := client.Get(info.EtcdEndpoints[0] + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("etcd answered a client without a certificate: %s", resp.Status)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := c.Node("eu-west", 0)
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := n.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if r := postPaymentTLS(t, c.ClientTLS(), away.URL, token, "tls-2", "invoice-tls-2"); r.status != http.StatusCreated {
		t.Errorf("after the home node restarted: %d %s", r.status, r.body)
	}

	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
}

// TestGlobalStore shares one database between the regions: a payment made
// in one region is a replay in the other, served there without forwarding.
func TestGlobalStore(t *testing.T) {
	c := startCluster(t, cluster.Config{
		Regions:     []string{"eu-west", "us-east"},
		EtcdMembers: 1,
		StoreMode:   cluster.StoreGlobal,
	})
	info := c.Info()
	if info.StoreMode != cluster.StoreGlobal || len(info.EtcdEndpoints) != 1 {
		t.Errorf("store mode %q, etcd %q", info.StoreMode, info.EtcdEndpoints)
	}
	for _, r := range info.Regions {
		if !strings.Contains(r.DatabaseURL, "/"+cluster.GlobalDatabase+"?") || r.DatabaseURL != info.DatabaseURL {
			t.Errorf("region %s: database %q, want the shared %s", r.Name, r.DatabaseURL, cluster.GlobalDatabase)
		}
	}
	token := info.Tokens["tenant-b"] // home us-east
	first := postPayment(t, info.Regions[0].URL, token, "g-1", "invoice-g")
	again := postPayment(t, info.Regions[1].URL, token, "g-1", "invoice-g")
	if first.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
		t.Errorf("same key in both regions: %d then %d (replayed %q)\n%s\n%s", first.status, again.status,
			again.header.Get("Idempotent-Replayed"), first.body, again.body)
	}
}

// TestEtcdMemberKilled kills the etcd leader: the two members left keep a
// quorum, so the cluster keeps serving new payments; the killed member
// then rejoins with its data.
func TestEtcdMemberKilled(t *testing.T) {
	c := startCluster(t, cluster.Config{Regions: []string{"eu-west", "us-east"}, EtcdMembers: 3})
	info := c.Info()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	leader, err := c.EtcdLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldPid := leader.Pid()
	t.Logf("killing the etcd leader %s (pid %d)", leader.Name(), oldPid)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for i, r := range info.Regions {
		// tenant-a is served by eu-west, through forwarding from us-east.
		key := "after-kill-" + r.Name
		resp := postUntilServed(ctx, t, r.URL, info.Tokens["tenant-a"], key, "invoice-kill-"+r.Name)
		if resp.status != http.StatusCreated {
			t.Errorf("POST %d to %s with a member down: %d %s", i, r.Name, resp.status, resp.body)
		}
	}
	t.Logf("payments served %v after the kill", time.Since(began).Round(time.Millisecond))
	newLeader := waitLeader(ctx, t, c, func(p *cluster.Process) bool { return p != leader })
	t.Logf("new leader %s", newLeader.Name())

	if err := leader.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if leader.Pid() == oldPid || !leader.Running() {
		t.Errorf("after Restart: pid %d (was %d), running %v", leader.Pid(), oldPid, leader.Running())
	}
	// The restarted member follows the cluster's leader.
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
			return fmt.Errorf("restarted member %s follows %x, the leader %s is %x", leader.Name(), st.Leader, cur.Name(), curSt.Header.MemberId)
		}
		return nil
	})
	if r := postUntilServed(ctx, t, info.Regions[1].URL, info.Tokens["tenant-b"], "after-restart", "invoice-restart"); r.status != http.StatusCreated {
		t.Errorf("POST after the restart: %d %s", r.status, r.body)
	}
	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
}

// postUntilServed retries the same payment (same key) while the cluster
// answers 5xx or 421, as a client would while etcd elects a leader.
func postUntilServed(ctx context.Context, tb testing.TB, baseURL, token, key, ref string) response {
	tb.Helper()
	for {
		r := postPayment(tb, baseURL, token, key, ref)
		if (r.status < 500 && r.status != http.StatusMisdirectedRequest) || ctx.Err() != nil {
			return r
		}
		tb.Logf("POST %s: %d %s; retrying", baseURL, r.status, bytes.TrimSpace(r.body))
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitLeader waits until the etcd cluster has a leader for which ok holds.
func waitLeader(ctx context.Context, tb testing.TB, c *cluster.Cluster, ok func(*cluster.Process) bool) *cluster.Process {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := c.EtcdLeader(ctx)
		if err == nil && ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no suitable etcd leader after 30s: %v, %v", p, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// etcdStatus asks member p for its status.
func etcdStatus(ctx context.Context, c *cluster.Cluster, p *cluster.Process) (*clientv3.StatusResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.EtcdClient().Status(sctx, p.URL())
}

// eventually retries check every 100ms until it returns nil, and fails the
// test with its last error after timeout.
func eventually(tb testing.TB, timeout time.Duration, check func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// countRows runs a count query on a database.
func countRows(ctx context.Context, tb testing.TB, dbURL, query string) int {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, query).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// sameStrings reports whether a and b hold the same strings, in any order.
func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		if seen[s]--; seen[s] < 0 {
			return false
		}
	}
	return true
}

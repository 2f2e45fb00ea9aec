package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// testRegion is one region of a test deployment: its store and its nodes.
type testRegion struct {
	name  string
	db    string
	store *store.Store
	nodes []*proc
}

// startRegion starts n nodes of region name on a fresh database, joined
// through etcd.
func startRegion(t *testing.T, name string, n int, etcd string, env []string, extra ...string) *testRegion {
	t.Helper()
	r := &testRegion{name: name, db: pgtest.NewDatabase(t)}
	r.store = openStore(t, r.db)
	for i := range n {
		args := append([]string{"--region", name, "--etcd-endpoints", etcd, "--node-id", fmt.Sprintf("%s-%d", name, i),
			"--region-lease-ttl", "2s", "--peer-secret-file", peerSecretFile}, extra...)
		r.nodes = append(r.nodes, startIdemdEnv(t, env, r.db, args...))
	}
	return r
}

func payBody(t *testing.T, url, key, body string, header ...string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func codeOf(body []byte) string {
	var e struct{ ErrorCode string }
	_ = json.Unmarshal(body, &e)
	return e.ErrorCode
}

// TestSameKeyInTwoRegions: the same key sent to two regions at once makes one
// payment, in the home region's store; replays from either region are byte
// for byte the same; a client's Idem-Forwarded-By is refused.
func TestSameKeyInTwoRegions(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(etcd.Endpoints, ",")
	eu := startRegion(t, "eu-west", 1, ep, nil)
	us := startRegion(t, "us-east", 1, ep, nil)
	urls := []string{eu.nodes[0].url, us.nodes[0].url}

	var mu sync.Mutex
	bodies := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 20 {
		wg.Go(func() {
			<-start
			status, body, _ := payBody(t, urls[i%2], "both-regions", article)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case status == 201:
				bodies[string(body)]++
			case status == 409 && codeOf(body) == idem.ECodeInProgress:
			default:
				t.Errorf("answer %d %s", status, body)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(bodies) != 1 {
		t.Fatalf("distinct 201 bodies: %v", bodies)
	}
	if n := storetest.Count(t, eu.store, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("home store has %d payments, want 1", n)
	}
	if n := storetest.Count(t, us.store, `SELECT count(*) FROM payments`) + storetest.Count(t, us.store, `SELECT count(*) FROM idempotency_records`); n != 0 {
		t.Errorf("the non-home store holds %d rows, want none", n)
	}
	_, fromEU, hEU := payBody(t, urls[0], "both-regions", article)
	_, fromUS, hUS := payBody(t, urls[1], "both-regions", article)
	if !bytes.Equal(fromEU, fromUS) || hEU.Get("Idempotent-Replayed") != "true" || hUS.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replays differ: %s (%v) vs %s (%v)", fromEU, hEU, fromUS, hUS)
	}
	// A client cannot pose as a forwarding node.
	status, body, _ := payBody(t, urls[1], "loop", article, "Idem-Forwarded-By", "ap-south/x; hops=1")
	if status != http.StatusForbidden || codeOf(body) != idem.ECodeForwardingNotAuthenticated {
		t.Errorf("client-supplied Idem-Forwarded-By = %d %s, want 403 %s", status, body, idem.ECodeForwardingNotAuthenticated)
	}
}

// TestPausedRecoveryOwnerIsFenced: a recovery owner is paused (SIGSTOP) past
// its lease while a new owner takes over. On resume its provider call (or,
// paused earlier, its store write) is rejected by token, and the payment is
// charged once.
func TestPausedRecoveryOwnerIsFenced(t *testing.T) {
	for _, tc := range []struct {
		failpoint string
		// rejectedBy names who must refuse the old owner.
		rejectedBy string
	}{
		{"recovery-before-provider-call", "provider"},
		{"recovery-before-checkpoint", "store"},
	} {
		t.Run(tc.rejectedBy, func(t *testing.T) { testPausedOwner(t, tc.failpoint) })
	}
}

func testPausedOwner(t *testing.T, fp string) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	prov := providertest.Start(t)
	ep := strings.Join(etcd.Endpoints, ",")
	db := pgtest.NewDatabase(t)
	st := openStore(t, db)
	common := []string{"--region", "eu-west", "--etcd-endpoints", ep, "--region-lease-ttl", "2s", "--lock-timeout", "2s",
		"--provider-url", prov.BaseURL, "--recovery-interval", "0"}
	x := startFailpointsIdemd(t, []string{"IDEM_FAILPOINTS=" + fp + "=1*sleep(12s)"}, db, append(common, "--node-id", "x")...)
	y := startFailpointsIdemd(t, nil, db, append(common, "--node-id", "y")...)

	// A provider failure leaves the record FAILED_RETRYABLE: the next retry
	// recovers it under an etcd lock.
	if err := prov.SetFault(ctx, provider.Fault{Mode: provider.FaultFail, Times: 1}); err != nil {
		t.Fatal(err)
	}
	if status, body, _ := payBody(t, x.url, "fenced-1", article); status != 503 || codeOf(body) != payments.ECodeProviderUnavailable {
		t.Fatalf("first attempt = %d %s", status, body)
	}
	type answer struct {
		status int
		body   []byte
	}
	xAnswer := make(chan answer, 1)
	go func() {
		status, body, _ := payBody(t, x.url, "fenced-1", article)
		xAnswer <- answer{status, body}
	}()
	scope := idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "fenced-1"}
	var xToken int64
	waitFor(t, 20*time.Second, "x to take recovery ownership", func() bool {
		rec, err := st.Get(ctx, scope)
		xToken = rec.FencingToken
		return err == nil && rec.Status == idem.StatusInProgress && rec.FencingToken > 1
	})
	time.Sleep(300 * time.Millisecond) // let x reach its failpoint
	if err := x.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = x.cmd.Process.Signal(syscall.SIGCONT) }
	defer cont()
	cli := etcd.Client(t)
	waitFor(t, 20*time.Second, "x's lease to expire in etcd", func() bool {
		resp, err := cli.Get(ctx, routing.NodeKey("eu-west", "x"))
		return err == nil && len(resp.Kvs) == 0
	})
	waitFor(t, 20*time.Second, "x's lock on the record to go stale", func() bool {
		status, body, _ := payBody(t, y.url, "fenced-1", article)
		if status == 201 {
			return true
		}
		if status != 409 {
			t.Fatalf("new owner answer %d %s", status, body)
		}
		return false
	})
	rec, err := st.Get(ctx, scope)
	if err != nil || rec.Status != idem.StatusCompleted || rec.FencingToken <= xToken {
		t.Fatalf("after takeover: %+v, %v; want COMPLETED under a token above %d", rec, err, xToken)
	}
	cont()
	var a answer
	select {
	case a = <-xAnswer:
	case <-time.After(30 * time.Second):
		t.Fatalf("paused owner never answered; log:\n%s", x.log)
	}
	if a.status != 409 || codeOf(a.body) != idem.ECodeInProgress {
		t.Errorf("paused owner answered %d %s, want 409 %s", a.status, a.body, idem.ECodeInProgress)
	}
	counts, err := prov.Charges(ctx)
	if err != nil || counts.Total != 1 {
		t.Errorf("charges = %+v, %v; want exactly 1", counts, err)
	}
	if got, _ := st.Get(ctx, scope); got.FencingToken != rec.FencingToken || got.Status != idem.StatusCompleted {
		t.Errorf("the paused owner changed the record: %+v", got)
	}
	if m := metric(t, x.url, "idempotency_fenced_total"); m < 1 {
		t.Errorf("x's idempotency_fenced_total = %v, want >= 1; log:\n%s", m, x.log)
	}
	wantLog := map[string]string{"recovery-before-provider-call": "provider rejected a stale fencing token", "recovery-before-checkpoint": "store rejected a stale fencing token"}[fp]
	if !strings.Contains(x.log.String(), wantLog) {
		t.Errorf("x's log lacks %q:\n%s", wantLog, x.log)
	}
}

// metric reads one unlabelled sample from a node's /metrics.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		var v float64
		if strings.HasPrefix(line, name+" ") {
			if _, err := fmt.Sscanf(line[len(name)+1:], "%g", &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// TestPlacementEpochBumpDuringTraffic: a tenant moves between live regions
// while clients send new keys and retry old ones in both. No key is charged
// twice and every key's successful answers agree.
func TestPlacementEpochBumpDuringTraffic(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	prov := providertest.Start(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(etcd.Endpoints, ",")
	eu := startRegion(t, "eu-west", 1, ep, nil, "--provider-url", prov.BaseURL)
	us := startRegion(t, "us-east", 1, ep, nil, "--provider-url", prov.BaseURL)
	urls := []string{eu.nodes[0].url, us.nodes[0].url}

	var mu sync.Mutex
	answers := map[string]map[string]bool{} // key -> distinct 201 bodies
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for w := range 6 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				body := strings.Replace(article, "invoice-7781", key, 1)
				for attempt := range 3 { // the retry goes to another region
					status, b, _ := payBody(t, urls[(w+attempt+rand.IntN(2))%2], key, body)
					mu.Lock()
					if status == 201 {
						if answers[key] == nil {
							answers[key] = map[string]bool{}
						}
						answers[key][string(b)] = true
					}
					mu.Unlock()
					if status == 201 {
						break
					}
				}
			}
		})
	}
	time.Sleep(1 * time.Second)
	moved, err := routing.MoveTenant(ctx, cli, "tenant-a", "us-east", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(answers) < 10 {
		t.Fatalf("only %d keys succeeded: traffic too thin to mean anything", len(answers))
	}
	for key, bodies := range answers {
		if len(bodies) != 1 {
			t.Errorf("key %s got %d different 201 answers", key, len(bodies))
		}
	}
	counts, err := prov.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key, n := range counts.ByKey {
		if n != 1 {
			t.Errorf("provider key %s charged %d times", key, n)
		}
	}
	if p, _, _ := routing.GetPlacement(ctx, cli, "tenant-a"); p.Region != "us-east" || p.Epoch != moved.Epoch {
		t.Errorf("placement = %+v, want us-east at epoch %d", p, moved.Epoch)
	}
	t.Logf("%d keys, %d charges, moved at epoch %d", len(answers), counts.Total, moved.Epoch)
}

// TestGlobalStoreMode: two regions share one store; each serves every tenant
// without forwarding, and the same key sent to both at once is one payment.
func TestGlobalStoreMode(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	if _, err := routing.SetPlacement(ctx, etcd.Client(t), "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(etcd.Endpoints, ",")
	db := pgtest.NewDatabase(t)
	st := openStore(t, db)
	var urls []string
	for _, r := range []string{"eu-west", "us-east"} {
		urls = append(urls, startIdemd(t, db, "--region", r, "--etcd-endpoints", ep, "--store-mode", "global", "--node-id", r).url)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 10 {
		wg.Go(func() {
			<-start
			if status, body, _ := payBody(t, urls[i%2], "global-1", article); status != 201 && !(status == 409 && codeOf(body) == idem.ECodeInProgress) {
				t.Errorf("answer %d %s", status, body)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := storetest.Count(t, st, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	_, _, h := payBody(t, urls[1], "global-1", article)
	if h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay from the non-home region: %v", h)
	}
	if m := metric(t, urls[1], "idempotency_forwarded_total"); m > 0 {
		t.Errorf("global mode forwarded %v requests", m)
	}
}

// TestNodeClockSkewDoesNotMoveRecordTimes: two nodes whose clocks are 25h
// apart (beyond the 24h window either way) share a store; a record written
// by one is replayed by the other, and its times are the store's.
func TestNodeClockSkewDoesNotMoveRecordTimes(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	st := openStore(t, db)
	ahead := startFailpointsIdemd(t, []string{"IDEM_CLOCK_SKEW=25h"}, db)
	behind := startFailpointsIdemd(t, []string{"IDEM_CLOCK_SKEW=-25h"}, db)
	status, first, _ := payBody(t, ahead.url, "skewed", article)
	if status != 201 {
		t.Fatalf("create on the fast node = %d %s", status, first)
	}
	status, again, h := payBody(t, behind.url, "skewed", article)
	if status != 201 || !bytes.Equal(again, first) || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay on the slow node = %d %s %v", status, again, h)
	}
	var dbNow time.Time
	if err := st.Pool().QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "skewed"})
	if err != nil {
		t.Fatal(err)
	}
	if d := dbNow.Sub(rec.CreatedAt); d < 0 || d > time.Minute {
		t.Errorf("created_at %v is %v from the store's now %v", rec.CreatedAt, d, dbNow)
	}
	if got := rec.ExpiresAt.Sub(rec.CreatedAt); got != 24*time.Hour {
		t.Errorf("window = %v, want 24h", got)
	}
}

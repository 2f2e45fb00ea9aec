package region_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
)

// countingUpstream counts executions by the derived key it receives and
// keeps the headers of the last request.
type countingUpstream struct {
	url  string
	mu   sync.Mutex
	runs map[string]int
	last http.Header
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{runs: map[string]int{}}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		key := r.Header.Get("Idempotency-Key")
		u.runs[key]++
		n := len(u.runs)
		u.last = r.Header.Clone()
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":"tr_%d","path":%q,"body":%s}`, n, r.URL.RequestURI(), body)
	}))
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

func (u *countingUpstream) snapshot() (map[string]int, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{}
	for k, v := range u.runs {
		out[k] = v
	}
	return out, u.last
}

func sidecarRoutes(t *testing.T, upstream string) region.SidecarConfig {
	t.Helper()
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + upstream)
	if err != nil {
		t.Fatal(err)
	}
	return region.SidecarConfig{Routes: routes}
}

func postTransfer(t *testing.T, client *http.Client, url, key string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/transfers/acc_1?x=1", strings.NewReader(`{"amount":"5.00"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Prefer", "wait=10")
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestSidecarForwardedToHomeRegion: a proxied route is authenticated and
// routed like payments: a request at the forwarding region executes once,
// in the home region, whose store alone holds the record; the upstream gets
// the home node's derived key and tenant and none of the credentials.
// Concurrent retries at both regions execute once and answer alike.
func TestSidecarForwardedToHomeRegion(t *testing.T) {
	c := newFwdCluster(t, false)
	up := newCountingUpstream(t)
	secret := []byte("s3cret-peer")
	eu := c.start("eu-west", region.Config{PeerSecret: secret, Sidecar: sidecarRoutes(t, up.url)})
	us := c.start("us-east", region.Config{PeerSecret: secret, Sidecar: sidecarRoutes(t, up.url)})

	a := postTransfer(t, c.client, us.url, "t1")
	if a.status != http.StatusCreated || !strings.Contains(string(a.body), `"path":"/transfers/acc_1?x=1"`) {
		t.Fatalf("forwarded: %d %s", a.status, a.body)
	}
	runs, h := up.snapshot()
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "t1", 0)
	if len(runs) != 1 || runs[derived] != 1 {
		t.Errorf("upstream runs %v, want one under %s", runs, derived)
	}
	if h.Get("Authorization") != "" || h.Get(region.HeaderPeerSecret) != "" || h.Get(region.HeaderForwardedBy) != "" ||
		h.Get("Idem-Tenant") != "tenant-a" || h.Get("Idem-Fencing-Token") == "" {
		t.Errorf("upstream headers %v", h)
	}
	if records(t, eu) != 1 || records(t, us) != 0 {
		t.Errorf("records: home %d, forwarder %d; want 1, 0", records(t, eu), records(t, us))
	}
	if b := postTransfer(t, c.client, eu.url, "t1"); string(b.body) != string(a.body) || b.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay at home: %d %s", b.status, b.body)
	}

	var wg sync.WaitGroup
	answers := make([]answer, 8)
	for i := range answers {
		wg.Go(func() {
			url := eu.url
			if i%2 == 1 {
				url = us.url
			}
			answers[i] = postTransfer(t, c.client, url, "race")
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.status != http.StatusCreated || string(a.body) != string(answers[0].body) {
			t.Errorf("answer %d: %d %s, want %s", i, a.status, a.body, answers[0].body)
		}
	}
	if runs, _ := up.snapshot(); runs[sidecar.DerivedKey("tenant-a", "create_transfer", "race", 0)] != 1 || len(runs) != 2 {
		t.Errorf("upstream runs %v, want one per key", runs)
	}
}

// TestSidecarRoutesMayNotShadowTheNode: a proxied route over the node's own
// paths or operations is refused at start.
func TestSidecarRoutesMayNotShadowTheNode(t *testing.T) {
	st, _ := storetest.New(t)
	pay := payments.NewService(st, payments.Config{Region: "test"})
	for _, s := range []string{
		"POST /payments=create_transfer@http://h",
		"POST /v1/coordination=create_transfer@http://h",
		"POST /v1/coordination/create_transfer=create_transfer@http://h",
		"POST /v1=create_transfer@http://h",
		"POST /v1/idempotency=create_transfer@http://h",
		"POST /healthz=create_transfer@http://h",
		"POST /metrics/x=create_transfer@http://h",
		"POST /transfers=" + payments.Operation + "@http://h",
		"POST /transfers=op@http://h",
		"POST /transfers=create_transfer@http://h;timeout=1m",
	} {
		routes, err := sidecar.ParseRoutes(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := region.NewServer(region.Config{Operations: []string{"op"}, Sidecar: region.SidecarConfig{Routes: routes}}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{})); err == nil {
			t.Errorf("NewServer accepted %q", s)
		}
	}
}

// TestSidecarRecordVisible: a proxied route's record is visible to its
// tenant at the record endpoint (where an operator finds an unknown one).
func TestSidecarRecordVisible(t *testing.T) {
	st, _ := storetest.New(t)
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test"}), region.Config{Sidecar: sidecarRoutes(t, "http://127.0.0.1:1")})
	a := n.do(http.MethodPost, "/transfers", "tok-a", map[string]string{"Idempotency-Key": "u1"}, `{}`)
	if a.status != http.StatusServiceUnavailable || a.code() != idem.ECodeUnavailable {
		t.Fatalf("unreachable upstream: %d %s", a.status, a.body)
	}
	rec := n.do(http.MethodGet, "/v1/idempotency/records/create_transfer/u1", "tok-a", nil, "")
	if rec.status != 200 || !strings.Contains(string(rec.body), string(idem.StatusFailedRetryable)) {
		t.Errorf("record view: %d %s", rec.status, rec.body)
	}
}

// TestSidecarRouteUnderV1: the proxied namespace is the upstream's: a route
// under /v1/ that none of the node's endpoints lies under or above starts
// and serves (a form-encoded body, as payment SDKs send), beside the node's
// own /v1 endpoints, which still answer.
func TestSidecarRouteUnderV1(t *testing.T) {
	st, _ := storetest.New(t)
	up := newCountingUpstream(t)
	routes, err := sidecar.ParseRoutes("POST /v1/charges=create_charge@" + up.url)
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test"}), region.Config{Sidecar: region.SidecarConfig{Routes: routes}})
	form := map[string]string{"Idempotency-Key": "ch-1", "Content-Type": "application/x-www-form-urlencoded"}
	first := n.do(http.MethodPost, "/v1/charges", "tok-a", form, "amount=2000&currency=eur")
	if first.status != http.StatusCreated || !strings.Contains(string(first.body), `"path":"/v1/charges"`) {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := n.do(http.MethodPost, "/v1/charges", "tok-a", form, "currency=eur&amount=2000")
	if again.status != http.StatusCreated || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %s %v", again.status, again.body, again.header)
	}
	if runs, _ := up.snapshot(); len(runs) != 1 {
		t.Errorf("upstream runs %v, want one", runs)
	}
	if rec := n.do(http.MethodGet, "/v1/idempotency/records/create_charge/ch-1", "tok-a", nil, ""); rec.status != 200 {
		t.Errorf("the node's record endpoint: %d %s", rec.status, rec.body)
	}
	if a := n.do(http.MethodPost, "/v1/refunds", "tok-a", form, "amount=1"); a.status != http.StatusNotFound {
		t.Errorf("an unrouted /v1 path: %d %s", a.status, a.body)
	}
}

// TestSidecarErrorEnvelopeCoversTheNode: a route with error-envelope=stripe
// gets the errors the node itself writes for its requests (a bad token, a
// path outside the route) in that envelope too, with the same status; the
// node's own endpoints keep problem+json.
func TestSidecarErrorEnvelopeCoversTheNode(t *testing.T) {
	st, _ := storetest.New(t)
	routes, err := sidecar.ParseRoutes("POST /v1/charges=create_charge@http://127.0.0.1:1;error-envelope=stripe")
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test"}), region.Config{Sidecar: region.SidecarConfig{Routes: routes}})
	form := map[string]string{"Idempotency-Key": "ch-1", "Content-Type": "application/x-www-form-urlencoded"}
	for _, tc := range []struct {
		name, path, token string
		status            int
		code, typ         string
	}{
		{"bad token", "/v1/charges", "nope", http.StatusUnauthorized, idem.ECodeUnauthenticated, "invalid_request_error"},
		{"path outside the route", "/v1/charges/%2e%2e/x", "tok-a", http.StatusBadRequest, idem.ECodePathInvalid, "invalid_request_error"},
		{"upstream unreachable", "/v1/charges", "tok-a", http.StatusServiceUnavailable, idem.ECodeUnavailable, "api_error"},
	} {
		a := n.do(http.MethodPost, tc.path, tc.token, form, "amount=1")
		var e struct {
			Error struct{ Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal(a.body, &e); err != nil || a.status != tc.status || e.Error.Code != tc.code || e.Error.Type != tc.typ ||
			a.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s %s, want %d and a Stripe error %s %s", tc.name, a.status, a.header.Get("Content-Type"), a.body, tc.status, tc.typ, tc.code)
		}
	}
	if a := n.do(http.MethodGet, "/v1/idempotency/records/create_charge/ch-1", "nope", nil, ""); a.status != http.StatusUnauthorized || a.header.Get("Content-Type") != idemhttp.ProblemContentType {
		t.Errorf("the node's own endpoint: %d %s %s, want 401 problem+json", a.status, a.header.Get("Content-Type"), a.body)
	}
}

package region_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/fakeclock"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const article = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`

type node struct {
	t     *testing.T
	url   string
	store *store.Store
	reg   *prometheus.Registry
}

func newNode(t *testing.T) *node {
	t.Helper()
	st, _ := storetest.New(t)
	return newNodeOn(t, st, time.Hour)
}

func newNodeOn(t *testing.T, st *store.Store, window time.Duration) *node {
	t.Helper()
	return startNode(t, st, payments.NewService(st, payments.Config{Region: "test", Window: window}), region.Config{})
}

// testOperations are the coordination operations the test nodes declare (the
// longest name allowed among them).
var testOperations = []string{"op", "charge", "ship.order", strings.Repeat("o", 64)}

// startNode serves a node over pay on an httptest server. cfg gets the test
// region, tokens, operations and a fresh registry where it leaves them empty.
func startNode(t *testing.T, st *store.Store, pay *payments.Service, cfg region.Config) *node {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = "test"
	}
	if cfg.Tokens == nil {
		cfg.Tokens = map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"}
	}
	if cfg.Operations == nil {
		cfg.Operations = testOperations
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	srv, err := region.NewServer(cfg, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &node{t: t, url: hs.URL, store: st, reg: cfg.Registry}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) code() string {
	var e struct{ ErrorCode string }
	_ = json.Unmarshal(a.body, &e)
	return e.ErrorCode
}

func (n *node) do(method, path, token string, headers map[string]string, body string) answer {
	n.t.Helper()
	req, err := http.NewRequest(method, n.url+path, strings.NewReader(body))
	if err != nil {
		n.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Errorf("%s %s: %v", method, path, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (n *node) pay(token, key, body string) answer {
	n.t.Helper()
	h := map[string]string{}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	return n.do(http.MethodPost, "/payments", token, h, body)
}

func paymentID(t *testing.T, a answer) string {
	t.Helper()
	var p struct{ PaymentID string }
	if err := json.Unmarshal(a.body, &p); err != nil || p.PaymentID == "" {
		t.Fatalf("no paymentId in %d %s", a.status, a.body)
	}
	return p.PaymentID
}

func (n *node) counts() (records, pays, events int) {
	return storetest.Count(n.t, n.store, `SELECT count(*) FROM idempotency_records`),
		storetest.Count(n.t, n.store, `SELECT count(*) FROM payments`),
		storetest.Count(n.t, n.store, `SELECT count(*) FROM outbox_events`)
}

// TestCompletedReplay: the article's first case. A retry gets the same payment
// (pay_789, never pay_790), byte for byte, marked as replayed.
func TestCompletedReplay(t *testing.T) {
	n := newNode(t)
	first := n.pay("tok-a", "abc-123", article)
	if first.status != http.StatusCreated {
		t.Fatalf("first = %d %s", first.status, first.body)
	}
	want := `{"paymentId":"` + paymentID(t, first) + `","status":"PENDING","accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781","channel":"web"}`
	if string(first.body) != want {
		t.Errorf("body = %s, want %s", first.body, want)
	}
	if first.header.Get("Idempotent-Replayed") != "" || first.header.Get("Idempotency-Window") != "3600" {
		t.Errorf("first headers = %v", first.header)
	}
	// Same command, re-serialised as another client library would.
	for _, body := range []string{article, `{"currency":"eur","amount":"10.0","merchantReference":"invoice-7781","accountId":"acc_1","channel":"web"}`} {
		again := n.pay("tok-a", "abc-123", body)
		if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay = %d %s, want 201 %s", again.status, again.body, first.body)
		}
		if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Location") != first.header.Get("Location") {
			t.Errorf("replay headers = %v", again.header)
		}
	}
	if r, p, e := n.counts(); r != 1 || p != 1 || e != 1 {
		t.Errorf("records/payments/events = %d/%d/%d, want 1/1/1", r, p, e)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_replay_total")); got != 2 {
		t.Errorf("idempotency_replay_total = %v, want 2", got)
	}
	get := n.do(http.MethodGet, "/payments/"+paymentID(t, first), "tok-a", nil, "")
	if get.status != http.StatusOK || !bytes.Equal(get.body, first.body) {
		t.Errorf("GET payment = %d %s", get.status, get.body)
	}
}

// TestDifferentCommandRejected: same key, amount 100.00 instead of 10.00.
func TestDifferentCommandRejected(t *testing.T) {
	n := newNode(t)
	if a := n.pay("tok-a", "abc-123", article); a.status != http.StatusCreated {
		t.Fatalf("first = %d %s", a.status, a.body)
	}
	for _, body := range []string{
		strings.Replace(article, `"10.00"`, `"100.00"`, 1),
		strings.Replace(article, `}`, `,"channel":"mobile"}`, 1),
	} {
		a := n.pay("tok-a", "abc-123", body)
		if a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
			t.Errorf("reuse with %s = %d %s, want 409 %s", body, a.status, a.body, idem.ECodeKeyReused)
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_conflict_different_request_total")); got != 2 {
		t.Errorf("conflict counter = %v, want 2", got)
	}
	if _, p, _ := n.counts(); p != 1 {
		t.Errorf("payments = %d, want 1", p)
	}
}

// TestConcurrentIdenticalRequests: 50 identical requests at once make one
// payment and one outbox event; every other answer is a replay or in-progress.
func TestConcurrentIdenticalRequests(t *testing.T) {
	n := newNode(t)
	answers := concurrently(50, func() answer { return n.pay("tok-a", "race-1", article) })
	var created []byte
	fresh := 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			if created != nil && !bytes.Equal(created, a.body) {
				t.Errorf("two different 201 bodies: %s and %s", created, a.body)
			}
			created = a.body
			if a.header.Get("Idempotent-Replayed") != "true" {
				fresh++
			}
		case a.status == http.StatusConflict && a.code() == idem.ECodeInProgress:
		default:
			t.Errorf("unexpected answer %d %s", a.status, a.body)
		}
	}
	if fresh != 1 {
		t.Errorf("%d answers claim to be the first execution, want exactly 1", fresh)
	}
	if r, p, e := n.counts(); r != 1 || p != 1 || e != 1 {
		t.Errorf("records/payments/events = %d/%d/%d, want 1/1/1", r, p, e)
	}
}

// TestStaleInProgressTakenOverOnce: a record left IN_PROGRESS by a dead owner
// is recovered by exactly one of 20 concurrent retries.
func TestStaleInProgressTakenOverOnce(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	cmd, err := payments.ParseCommand([]byte(article), "")
	if err != nil {
		t.Fatal(err)
	}
	hashes, _ := cmd.Fingerprint()
	dead, err := n.store.Begin(ctx, idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "stale-1"},
		RequestHashes: hashes, HashVersion: 1, Owner: "dead-node", LockFor: time.Minute, Window: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, n.store, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second'`)
	answers := concurrently(20, func() answer { return n.pay("tok-a", "stale-1", article) })
	var body []byte
	for _, a := range answers {
		if a.status == http.StatusConflict && a.code() == idem.ECodeInProgress {
			continue
		}
		if a.status != http.StatusCreated || (body != nil && !bytes.Equal(body, a.body)) {
			t.Errorf("answer %d %s", a.status, a.body)
		}
		body = a.body
	}
	if _, p, e := n.counts(); p != 1 || e != 1 {
		t.Errorf("payments/events = %d/%d, want 1/1", p, e)
	}
	rec, err := n.store.Get(ctx, dead.Lease.Scope)
	if err != nil || rec.Attempts != 2 || rec.Status != idem.StatusCompleted || rec.FencingToken != dead.Lease.Token+1 {
		t.Errorf("record = %+v, %v; want COMPLETED after exactly one takeover", rec, err)
	}
	if err := n.store.Complete(ctx, dead.Lease, idem.Completion{Response: idem.Response{Status: 201}}); err == nil {
		t.Error("the dead owner could still complete the record")
	}
}

// TestPreferWait: a client that asks to wait gets the final answer of the
// original request instead of 409.
func TestPreferWait(t *testing.T) {
	st, _ := storetest.New(t)
	// The waiting request's polls report themselves and wait to be let go,
	// so the owner completes while the request is waiting, not before it
	// arrived.
	clock := fakeclock.NewStep(time.Now())
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test", Window: time.Hour, Sleep: clock.Sleep}), region.Config{})
	ctx := context.Background()
	cmd, _ := payments.ParseCommand([]byte(article), "")
	hashes, _ := cmd.Fingerprint()
	owner, err := n.store.Begin(ctx, idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "wait-1"},
		RequestHashes: hashes, HashVersion: 1, Owner: "slow-node", LockFor: time.Minute, Window: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	nowait := n.pay("tok-a", "wait-1", article)
	if nowait.status != http.StatusConflict || nowait.code() != idem.ECodeInProgress || nowait.header.Get("Retry-After") == "" {
		t.Fatalf("without wait = %d %v %s, want 409 in progress with Retry-After", nowait.status, nowait.header, nowait.body)
	}
	done := make(chan answer, 1)
	go func() {
		done <- n.do(http.MethodPost, "/payments", "tok-a", map[string]string{"Idempotency-Key": "wait-1", "Prefer": "wait=10"}, article)
	}()
	select {
	case <-clock.Sleeping: // the request found the record in progress and is waiting
	case a := <-done:
		t.Fatalf("with wait, answered before the owner finished: %d %s", a.status, a.body)
	}
	final := `{"paymentId":"pay_from_owner"}`
	if err := n.store.Complete(ctx, owner.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(final)}}); err != nil {
		t.Fatal(err)
	}
	close(clock.Tick)
	a := <-done
	if a.status != http.StatusCreated || string(a.body) != final || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("with wait = %d %s, want the owner's 201 %s", a.status, a.body, final)
	}
}

// TestTenantIsolation: the same key in two tenants is two operations, and one
// tenant cannot learn about the other's keys.
func TestTenantIsolation(t *testing.T) {
	n := newNode(t)
	a := n.pay("tok-a", "shared-key", article)
	b := n.pay("tok-b", "shared-key", article)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("answers = %d %s / %d %s", a.status, a.body, b.status, b.body)
	}
	if paymentID(t, a) == paymentID(t, b) {
		t.Error("two tenants got the same payment")
	}
	mine := n.do(http.MethodGet, "/v1/idempotency/records/create_payment/shared-key", "tok-a", nil, "")
	if mine.status != http.StatusOK || !strings.Contains(string(mine.body), `"status":"COMPLETED"`) || strings.Contains(string(mine.body), "tenant-b") {
		t.Errorf("own record = %d %s", mine.status, mine.body)
	}
	n.pay("tok-a", "only-a", article)
	theirs := n.do(http.MethodGet, "/v1/idempotency/records/create_payment/only-a", "tok-b", nil, "")
	absent := n.do(http.MethodGet, "/v1/idempotency/records/create_payment/never-used", "tok-b", nil, "")
	if theirs.status != http.StatusNotFound || theirs.code() != idem.ECodeRecordNotFound || !bytes.Equal(theirs.body, absent.body) {
		t.Errorf("other tenant's record = %d %s; absent = %d %s; want identical 404s", theirs.status, theirs.body, absent.status, absent.body)
	}
	if p := n.do(http.MethodGet, "/payments/"+paymentID(t, a), "tok-b", nil, ""); p.status != http.StatusNotFound {
		t.Errorf("other tenant's payment = %d %s, want 404", p.status, p.body)
	}
}

// TestRejectedRequestsStoreNothing: auth and validation failures create no
// record, payment or event, and answer with stable codes.
func TestRejectedRequestsStoreNothing(t *testing.T) {
	n := newNode(t)
	big := `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + strings.Repeat("x", 70<<10) + `"}`
	for _, tc := range []struct {
		name, token, key, body string
		status                 int
		code                   string
	}{
		{"no token", "", "k1", article, 401, idem.ECodeUnauthenticated},
		{"unknown token", "nope", "k1", article, 401, idem.ECodeUnauthenticated},
		{"no key", "tok-a", "", article, 400, idem.ECodeKeyMissing},
		{"key too long", "tok-a", strings.Repeat("k", 256), article, 400, idem.ECodeKeyInvalid},
		{"key with space", "tok-a", "a b", article, 400, idem.ECodeKeyInvalid},
		{"malformed json", "tok-a", "k2", `{"accountId":`, 422, idem.ECodeRequestMalformed},
		{"unknown field", "tok-a", "k3", strings.Replace(article, `}`, `,"foo":"bar"}`, 1), 422, idem.ECodeValidationFailed},
		{"missing field", "tok-a", "k4", `{"accountId":"acc_1","currency":"EUR","merchantReference":"r"}`, 422, idem.ECodeValidationFailed},
		{"bad amount", "tok-a", "k5", strings.Replace(article, `"10.00"`, `"ten"`, 1), 422, idem.ECodeValidationFailed},
		{"too large", "tok-a", "k6", big, 413, idem.ECodeBodyTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := n.pay(tc.token, tc.key, tc.body)
			if a.status != tc.status || a.code() != tc.code {
				t.Errorf("answer = %d %s, want %d %s", a.status, a.body, tc.status, tc.code)
			}
		})
	}
	if a := n.do(http.MethodPost, "/payments", "tok-a", map[string]string{"Idempotency-Key": "k7", "Api-Version": "1999-01-01"}, article); a.status != 400 || a.code() != idem.ECodeAPIVersionUnsupported {
		t.Errorf("unsupported Api-Version = %d %s", a.status, a.body)
	}
	if r, p, e := n.counts(); r != 0 || p != 0 || e != 0 {
		t.Errorf("records/payments/events = %d/%d/%d after rejected requests, want 0/0/0", r, p, e)
	}
}

// TestDuplicateMerchantReference: a duplicate sent with a fresh key is caught
// by the business constraint and names the existing payment; the answer is
// replayed for that key.
func TestDuplicateMerchantReference(t *testing.T) {
	n := newNode(t)
	first := n.pay("tok-a", "key-1", article)
	dup := n.pay("tok-a", "key-2", article)
	if dup.status != http.StatusConflict || dup.code() != payments.ECodeDuplicateMerchantRef ||
		!strings.Contains(string(dup.body), `"existingPaymentId":"`+paymentID(t, first)+`"`) {
		t.Fatalf("duplicate = %d %s", dup.status, dup.body)
	}
	again := n.pay("tok-a", "key-2", article)
	if again.status != http.StatusConflict || !bytes.Equal(again.body, dup.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of the duplicate = %d %s %v", again.status, again.body, again.header)
	}
	if _, p, _ := n.counts(); p != 1 {
		t.Errorf("payments = %d, want 1", p)
	}
}

// TestRetryAfterWindowIsNewOperation: after the window a retry is a new
// operation, counted; an expired record is never replayed.
func TestRetryAfterWindowIsNewOperation(t *testing.T) {
	st, _ := storetest.New(t)
	n := newNodeOn(t, st, time.Hour)
	first := n.pay("tok-a", "old-key", article)
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second'`)
	other := strings.Replace(article, "invoice-7781", "invoice-7782", 1)
	again := n.pay("tok-a", "old-key", other)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "" || paymentID(t, again) == paymentID(t, first) {
		t.Errorf("retry after window = %d %s, want a new payment", again.status, again.body)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_expired_retry_total")); got != 1 {
		t.Errorf("expired retry counter = %v, want 1", got)
	}
}

func TestHealthAndMetricsEndpoints(t *testing.T) {
	n := newNode(t)
	n.pay("tok-a", "m-1", article)
	for path, want := range map[string]string{
		"/healthz": `"status":"ok"`,
		"/readyz":  `"status":"ready"`,
		"/metrics": "idempotency_in_progress_age_max_seconds 0",
	} {
		if a := n.do(http.MethodGet, path, "", nil, ""); a.status != 200 || !strings.Contains(string(a.body), want) {
			t.Errorf("GET %s = %d, want 200 containing %q:\n%.400s", path, a.status, want, a.body)
		}
	}
	if a := n.do(http.MethodDelete, "/payments", "tok-a", nil, ""); a.status != 405 || a.code() != idem.ECodeMethodNotAllowed {
		t.Errorf("DELETE /payments = %d %s", a.status, a.body)
	}
	if a := n.do(http.MethodGet, "/nowhere", "", nil, ""); a.status != 404 || a.code() != idem.ECodeNotFound {
		t.Errorf("GET /nowhere = %d %s", a.status, a.body)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
	c.Add(total)
	return c
}

func concurrently(n int, fn func() answer) []answer {
	out := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = fn()
		})
	}
	close(start)
	wg.Wait()
	return out
}

// TestTokensNameValidTenants: a library user's Config.Tokens follows the
// rules of a token file: a tenant name with white space, ',' or '=' (or
// none) is refused at construction, and the message never holds a token.
func TestTokensNameValidTenants(t *testing.T) {
	st, _ := storetest.New(t)
	for _, tokens := range []map[string]string{
		{"secret-1": "tenant-a,x=y"},
		{"secret-2": "tenant a"},
		{"secret-3": ""},
		{"": "tenant-a"},
	} {
		_, err := region.NewServer(region.Config{Tokens: tokens}, st)
		if err == nil {
			t.Errorf("NewServer accepted tokens %q", tokens)
			continue
		}
		for tok := range tokens {
			if tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("error %q shows the token", err)
			}
		}
	}
	if _, err := region.NewServer(region.Config{Tokens: map[string]string{"secret": "tenant-a"}}, st); err != nil {
		t.Errorf("a valid tenant: %v", err)
	}
}

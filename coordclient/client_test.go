package coordclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordclient"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const tenant = "tenant-a"

// implementation is one idem.Coordinator under test, with the store that
// holds its records (for test setup such as making a lock stale).
type implementation struct {
	name string
	open func(t *testing.T) (idem.Coordinator, *store.Store)
}

var implementations = []implementation{
	{"store", func(t *testing.T) (idem.Coordinator, *store.Store) {
		st, _ := storetest.New(t)
		return st, st
	}},
	{"client", func(t *testing.T) (idem.Coordinator, *store.Store) {
		st, _ := storetest.New(t)
		return newClient(t, st, "tok-a"), st
	}},
}

// newNode serves a regional node over st and returns its URL.
func newNode(t *testing.T, st *store.Store) string {
	t.Helper()
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour})
	srv, err := region.NewServer(region.Config{Region: "test", Tokens: map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"},
		Operations: []string{"contract_op", "op"}}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

func newClient(t *testing.T, st *store.Store, token string) *coordclient.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &coordclient.Client{BaseURL: newNode(t, st) + "/", Token: token, HTTP: &http.Client{Transport: tr}}
}

// TestCoordinatorContract runs the same assertions against the in-process
// engine and against the HTTP client of a node on the same kind of database.
func TestCoordinatorContract(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			c, st := impl.open(t)
			testCoordinator(t, c, st)
		})
	}
}

func hashOf(t *testing.T, fields map[string]any) string {
	t.Helper()
	h, err := fingerprint.Hash("contract_op", fields)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func testCoordinator(t *testing.T, c idem.Coordinator, st *store.Store) {
	ctx := context.Background()
	h1 := hashOf(t, map[string]any{"amount": "10.00", "account": "acc_1"})
	h2 := hashOf(t, map[string]any{"amount": "100.00", "account": "acc_1"})
	scope := func(key string) idem.Scope { return idem.Scope{Tenant: tenant, Operation: "contract_op", Key: key} }
	begin := func(t *testing.T, key, hash string) idem.Decision {
		t.Helper()
		d, err := c.Begin(ctx, idem.BeginRequest{
			Scope: scope(key), RequestHashes: []string{hash}, HashVersion: 1, Owner: "worker-1",
			LockFor: time.Minute, Window: time.Hour,
		})
		if err != nil {
			t.Fatalf("Begin(%q): %v", key, err)
		}
		if d.Record == nil {
			t.Fatalf("Begin(%q): no record in %+v", key, d)
		}
		return d
	}
	expectOwned := func(t *testing.T, d idem.Decision, outcome idem.Outcome, token int64) {
		t.Helper()
		if d.Outcome != outcome || d.Lease.Token != token || d.Lease.Scope != d.Record.Scope ||
			d.Record.Status != idem.StatusInProgress || d.Record.FencingToken != token || d.Record.Owner != "worker-1" {
			t.Fatalf("decision = %v lease %+v record %+v; want %v with token %d", d.Outcome, d.Lease, d.Record, outcome, token)
		}
	}
	expectNotOwned := func(t *testing.T, d idem.Decision, outcome idem.Outcome) {
		t.Helper()
		if d.Outcome != outcome || d.Lease != (idem.Lease{}) {
			t.Fatalf("decision = %v lease %+v; want %v without a lease", d.Outcome, d.Lease, outcome)
		}
	}
	expectFenced := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, idem.ErrFenced) {
			t.Errorf("%s = %v, want ErrFenced", what, err)
		}
	}
	stale := func(t *testing.T, key string) {
		storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = $1`, key)
	}
	// Response bytes that are not UTF-8 and not JSON must come back unchanged.
	body := append([]byte(`{"id":"res_1","note":"`), 0x00, 0xff, 0xfe, '"', '}')

	t.Run("execute checkpoint complete replay", func(t *testing.T) {
		// Keys that need escaping in a URL path, or that look like an escape
		// or a dot segment: the scope is the same either way.
		for _, key := range []string{"plain-1", "a/b//c", "x?y#z%20&", "a%2Fb", "%2E%2E", "...", "a/../b", "./x", `back\slash`, "a+b;c=d@e:f~!$&'()*,"} {
			t.Run(key, func(t *testing.T) {
				d := begin(t, key, h1)
				expectOwned(t, d, idem.OutcomeExecute, 1)
				if d.Record.Key != key || d.Record.Checkpoint != idem.CheckpointReceived || d.Record.RequestHash != h1 ||
					d.Record.Attempts != 1 || d.Record.LockedUntil == nil || d.ExpiredRetry {
					t.Errorf("claimed record = %+v", d.Record)
				}
				if err := c.Checkpoint(ctx, d.Lease, cpSent); err != nil {
					t.Fatal(err)
				}
				if rec, err := c.Get(ctx, scope(key)); err != nil || rec.Checkpoint != cpSent || rec.Status != idem.StatusInProgress {
					t.Fatalf("Get after checkpoint = %+v, %v", rec, err)
				}
				want := idem.Response{Status: 201, Headers: map[string]string{"Location": "/things/res_1", "Content-Type": "application/json"}, Body: body, SchemaVersion: "v2"}
				if err := c.Complete(ctx, d.Lease, idem.Completion{Response: want, ResourceType: "thing", ResourceID: "res_1"}); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					r := begin(t, key, h1)
					expectNotOwned(t, r, idem.OutcomeReplay)
					assertResponse(t, r.Record.Response, want)
					if r.Record.Status != idem.StatusCompleted || r.Record.ResourceID != "res_1" || r.Record.ResourceType != "thing" {
						t.Errorf("replayed record = %+v", r.Record)
					}
				}
				rec, err := c.Get(ctx, scope(key))
				if err != nil || rec.Status != idem.StatusCompleted || rec.Checkpoint != idem.CheckpointCompleted || rec.Key != key {
					t.Fatalf("Get = %+v, %v", rec, err)
				}
				assertResponse(t, rec.Response, want)
				expectFenced(t, "Checkpoint after Complete", c.Checkpoint(ctx, d.Lease, cpConfirmed))
				expectFenced(t, "Complete twice", c.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 500}}))
			})
		}
	})

	t.Run("a claim id gets its own open record back", func(t *testing.T) {
		// The answer to a Begin may be lost (the node unreachable after it
		// claimed): sent again with the same ClaimID, the Begin is handed
		// the record that claim inserted, with its token.
		claim := func(id string) idem.Decision {
			t.Helper()
			d, err := c.Begin(ctx, idem.BeginRequest{
				Scope: scope("claimed"), RequestHashes: []string{h1}, HashVersion: 1, Owner: "worker-1",
				LockFor: time.Minute, Window: time.Hour, ClaimID: id,
			})
			if err != nil {
				t.Fatalf("Begin with claim id %q: %v", id, err)
			}
			return d
		}
		expectOwned(t, claim("claim-0123456789abcdef"), idem.OutcomeExecute, 1)
		expectOwned(t, claim("claim-0123456789abcdef"), idem.OutcomeExecute, 1)
		expectNotOwned(t, claim("claim-of-another-request"), idem.OutcomeInProgress)
		expectNotOwned(t, begin(t, "claimed", h1), idem.OutcomeInProgress)
	})

	t.Run("dot segments are not keys", func(t *testing.T) {
		// "." and ".." would be resolved away by a path cleaner on the way to
		// a node; every implementation refuses them, so switching from the
		// store to a node refuses nothing new.
		for _, key := range []string{".", ".."} {
			_, err := c.Begin(ctx, idem.BeginRequest{Scope: scope(key), RequestHashes: []string{h1}, HashVersion: 1, LockFor: time.Minute, Window: time.Hour})
			if idem.ErrorCode(err) != idem.ECodeKeyInvalid {
				t.Errorf("Begin(%q) = %v, want %s", key, err, idem.ECodeKeyInvalid)
			}
			if _, err := st.Get(ctx, scope(key)); !errors.Is(err, idem.ErrRecordNotFound) {
				t.Errorf("record of %q: %v, want none", key, err)
			}
		}
	})

	t.Run("different hash conflicts, same hash waits", func(t *testing.T) {
		d := begin(t, "conflict-1", h1)
		expectOwned(t, d, idem.OutcomeExecute, 1)
		expectNotOwned(t, begin(t, "conflict-1", h2), idem.OutcomeConflict)
		expectNotOwned(t, begin(t, "conflict-1", h1), idem.OutcomeInProgress)
		if err := c.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 200, Body: []byte("ok")}}); err != nil {
			t.Fatal(err)
		}
		expectNotOwned(t, begin(t, "conflict-1", h2), idem.OutcomeConflict)
	})

	t.Run("stale token is fenced", func(t *testing.T) {
		old := begin(t, "fence-1", h1)
		expectOwned(t, old, idem.OutcomeExecute, 1)
		stale(t, "fence-1")
		cur := begin(t, "fence-1", h1)
		expectOwned(t, cur, idem.OutcomeRecover, 2)
		if cur.Record.Attempts != 2 {
			t.Errorf("attempts after takeover = %d, want 2", cur.Record.Attempts)
		}
		expectFenced(t, "stale Checkpoint", c.Checkpoint(ctx, old.Lease, cpSent))
		expectFenced(t, "stale Complete", c.Complete(ctx, old.Lease, idem.Completion{Response: idem.Response{Status: 201}}))
		expectFenced(t, "stale Fail", c.Fail(ctx, old.Lease, idem.Failure{Status: idem.StatusFailedRetryable}))
		if err := c.Complete(ctx, cur.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("second")}}); err != nil {
			t.Fatalf("current owner's Complete: %v", err)
		}
		rec, err := c.Get(ctx, scope("fence-1"))
		if err != nil || rec.FencingToken != 2 || string(rec.Response.Body) != "second" {
			t.Errorf("record = %+v, %v", rec, err)
		}
	})

	t.Run("absent key", func(t *testing.T) {
		if rec, err := c.Get(ctx, scope("never-used")); !errors.Is(err, idem.ErrRecordNotFound) || rec != nil {
			t.Errorf("Get(absent) = %+v, %v; want ErrRecordNotFound", rec, err)
		}
		lease := idem.Lease{Scope: scope("never-used"), Token: 1}
		expectFenced(t, "Checkpoint(absent)", c.Checkpoint(ctx, lease, idem.CheckpointReceived))
	})

	t.Run("failure classes", func(t *testing.T) {
		rejection := idem.Response{Status: 402, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"errorCode":"DECLINED"}`), SchemaVersion: "v2"}
		for _, tc := range []struct {
			key     string
			failure idem.Failure
			status  idem.Status
			next    idem.Outcome
		}{
			{"fail-replayable", idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: "DECLINED", Response: &rejection}, idem.StatusFailedReplayable, idem.OutcomeReplay},
			{"fail-retryable", idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: "DOWNSTREAM_DOWN"}, idem.StatusFailedRetryable, idem.OutcomeRecover},
			{"fail-unknown", idem.Failure{Status: idem.StatusUnknown, ErrorCode: "TIMEOUT"}, idem.StatusUnknown, idem.OutcomeRecover},
		} {
			t.Run(string(tc.status), func(t *testing.T) {
				d := begin(t, tc.key, h1)
				if err := c.Fail(ctx, d.Lease, tc.failure); err != nil {
					t.Fatal(err)
				}
				rec, err := c.Get(ctx, scope(tc.key))
				if err != nil || rec.Status != tc.status || rec.ErrorCode != tc.failure.ErrorCode || rec.LockedUntil != nil {
					t.Fatalf("after Fail: %+v, %v", rec, err)
				}
				next := begin(t, tc.key, h1)
				if tc.next == idem.OutcomeReplay {
					expectNotOwned(t, next, idem.OutcomeReplay)
					assertResponse(t, next.Record.Response, rejection)
					expectFenced(t, "Fail after a replayable failure", c.Fail(ctx, d.Lease, idem.Failure{Status: idem.StatusFailedRetryable}))
					return
				}
				expectOwned(t, next, tc.next, 2)
				expectFenced(t, "the failed owner's Complete", c.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201}}))
			})
		}
		d := begin(t, "fail-invalid", h1)
		for _, status := range []idem.Status{idem.StatusCompleted, idem.StatusInProgress, "NOPE"} {
			err := c.Fail(ctx, d.Lease, idem.Failure{Status: status})
			if !errors.Is(err, &idem.Error{Code: idem.ECodeValidationFailed}) {
				t.Errorf("Fail(%s) = %v, want %s", status, err, idem.ECodeValidationFailed)
			}
		}
		if rec, err := c.Get(ctx, scope("fail-invalid")); err != nil || rec.Status != idem.StatusInProgress {
			t.Errorf("after invalid failures: %+v, %v", rec, err)
		}
	})

	t.Run("after the window a retry is a new operation", func(t *testing.T) {
		d := begin(t, "expire-1", h1)
		if err := c.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201}}); err != nil {
			t.Fatal(err)
		}
		storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'expire-1'`)
		e := begin(t, "expire-1", h2)
		expectOwned(t, e, idem.OutcomeExpired, 2)
		if !e.ExpiredRetry || e.Record.Generation != 1 || e.Record.RequestHash != h2 || e.Record.Response != nil {
			t.Errorf("expired retry = %+v %+v", e, e.Record)
		}
	})

	t.Run("invalid begin", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			req  idem.BeginRequest
			code string
		}{
			{"no hash", idem.BeginRequest{Scope: scope("inv-1"), LockFor: time.Minute, Window: time.Hour}, idem.ECodeValidationFailed},
			{"no lock", idem.BeginRequest{Scope: scope("inv-2"), RequestHashes: []string{h1}, Window: time.Hour}, idem.ECodeValidationFailed},
			{"bad key", idem.BeginRequest{Scope: scope("a b"), RequestHashes: []string{h1}, LockFor: time.Minute, Window: time.Hour}, idem.ECodeKeyInvalid},
			{"empty key", idem.BeginRequest{Scope: scope(""), RequestHashes: []string{h1}, LockFor: time.Minute, Window: time.Hour}, idem.ECodeKeyInvalid},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := c.Begin(ctx, tc.req); idem.ErrorCode(err) != tc.code {
					t.Errorf("Begin = %v, want %s", err, tc.code)
				}
			})
		}
		if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE 'inv-%'`); n != 0 {
			t.Errorf("%d records written by invalid begins", n)
		}
	})
}

func assertResponse(t *testing.T, got *idem.Response, want idem.Response) {
	t.Helper()
	if got == nil {
		t.Fatalf("no stored response, want %+v", want)
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || got.SchemaVersion != want.SchemaVersion || len(got.Headers) != len(want.Headers) {
		t.Fatalf("response = %d %q %q %v, want %d %q %q %v", got.Status, got.Body, got.SchemaVersion, got.Headers, want.Status, want.Body, want.SchemaVersion, want.Headers)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, got.Headers[k], v)
		}
	}
}

// TestClientTenantComesFromToken: the client's BeginRequest.Tenant is not sent;
// the record lands in the token's tenant.
func TestClientTenantComesFromToken(t *testing.T) {
	st, _ := storetest.New(t)
	c := newClient(t, st, "tok-b")
	ctx := context.Background()
	d, err := c.Begin(ctx, idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "tenant-a", Operation: "op", Key: "k1"},
		RequestHashes: []string{"v1:abc"}, LockFor: time.Second, Window: time.Minute,
	})
	if err != nil || d.Outcome != idem.OutcomeExecute {
		t.Fatalf("Begin = %+v, %v", d, err)
	}
	if _, err := st.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: "op", Key: "k1"}); !errors.Is(err, idem.ErrRecordNotFound) {
		t.Errorf("tenant-a record: %v, want none", err)
	}
	rec, err := st.Get(ctx, idem.Scope{Tenant: "tenant-b", Operation: "op", Key: "k1"})
	if err != nil || rec.Owner != "coord/tenant-b" {
		t.Fatalf("tenant-b record = %+v, %v", rec, err)
	}
	// Rounded up to whole seconds: 1ns of lock is 1s, on the store's clock.
	c2 := newClient(t, st, "tok-b")
	d2, err := c2.Begin(ctx, idem.BeginRequest{
		Scope: idem.Scope{Operation: "op", Key: "k2"}, RequestHashes: []string{"v1:abc"}, LockFor: time.Nanosecond, Window: 1500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := d2.Record.LockedUntil.Sub(d2.Record.CreatedAt); got != time.Second {
		t.Errorf("lock = %v, want 1s", got)
	}
	if got := d2.Record.ExpiresAt.Sub(d2.Record.CreatedAt); got != 2*time.Second {
		t.Errorf("window = %v, want 2s", got)
	}
}

// TestClientRefusesLocally: a scope the node would refuse is refused by the
// client with the node's code, before any request: the keys "." and ".."
// (which a path cleaner would resolve, so the node could act on another
// path), keys and operations that are not valid.
func TestClientRefusesLocally(t *testing.T) {
	var requests atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "no", http.StatusTeapot)
	}))
	t.Cleanup(hs.Close)
	c := &coordclient.Client{BaseURL: hs.URL, Token: "tok-a", HTTP: hs.Client()}
	ctx := context.Background()
	for _, tc := range []struct {
		op, key, code string
	}{
		{"op", ".", idem.ECodeKeyInvalid},
		{"op", "..", idem.ECodeKeyInvalid},
		{"op", "", idem.ECodeKeyInvalid},
		{"op", "a b", idem.ECodeKeyInvalid},
		{"op", "caf\u00e9", idem.ECodeKeyInvalid},
		{"..", "k", idem.ECodeValidationFailed},
		{".", "k", idem.ECodeValidationFailed},
		{"", "k", idem.ECodeValidationFailed},
		{"Op", "k", idem.ECodeValidationFailed},
		{"a/b", "k", idem.ECodeValidationFailed},
	} {
		scope := idem.Scope{Operation: tc.op, Key: tc.key}
		lease := idem.Lease{Scope: scope, Token: 1}
		_, begin := c.Begin(ctx, idem.BeginRequest{Scope: scope, RequestHashes: []string{"v1:abc"}, LockFor: time.Second, Window: time.Minute})
		_, get := c.Get(ctx, scope)
		for name, err := range map[string]error{
			"Begin": begin, "Get": get,
			"Checkpoint": c.Checkpoint(ctx, lease, "X"),
			"Complete":   c.Complete(ctx, lease, idem.Completion{Response: idem.Response{Status: 200}}),
			"Fail":       c.Fail(ctx, lease, idem.Failure{Status: idem.StatusFailedRetryable}),
		} {
			if idem.ErrorCode(err) != tc.code {
				t.Errorf("%s(%q, %q) = %v, want %s", name, tc.op, tc.key, err, tc.code)
			}
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests reached the node, want 0", n)
	}
}

// TestClientErrors: the node's error bodies keep their codes; anything that is
// not an answer from the node is SERVICE_UNAVAILABLE (or INTERNAL for a
// malformed success).
func TestClientErrors(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	scope := idem.Scope{Operation: "op", Key: "k1"}
	req := idem.BeginRequest{Scope: scope, RequestHashes: []string{"v1:abc"}, LockFor: time.Second, Window: time.Minute}

	unknown := newClient(t, st, "not-a-token")
	if _, err := unknown.Begin(ctx, req); !errors.Is(err, &idem.Error{Code: idem.ECodeUnauthenticated}) {
		t.Errorf("unknown token: %v, want %s", err, idem.ECodeUnauthenticated)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	fake := func(status int, body string) string {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(hs.Close)
		return hs.URL
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	for _, tc := range []struct {
		name, url string
		ctx       context.Context
		code      string
	}{
		{"connection refused", closed, ctx, idem.ECodeUnavailable},
		{"cancelled context", newNode(t, st), cancelled, idem.ECodeUnavailable},
		{"proxy 502", fake(http.StatusBadGateway, "<html>bad gateway</html>"), ctx, idem.ECodeUnavailable},
		{"error body kept", fake(http.StatusConflict, `{"errorCode":"FENCING_TOKEN_STALE","message":"stale"}`), ctx, idem.ECodeFencingTokenStale},
		{"foreign 404", fake(http.StatusNotFound, "no such page"), ctx, idem.ECodeInternal},
		{"garbled success", fake(http.StatusOK, `{"outcome":`), ctx, idem.ECodeInternal},
		{"unknown outcome", fake(http.StatusOK, `{"outcome":"maybe","record":{}}`), ctx, idem.ECodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &coordclient.Client{BaseURL: tc.url, Token: "tok-a", HTTP: &http.Client{Transport: tr}}
			_, err := c.Begin(tc.ctx, req)
			if idem.ErrorCode(err) != tc.code {
				t.Errorf("Begin = %v, want %s", err, tc.code)
			}
			if tc.ctx == cancelled && !errors.Is(err, context.Canceled) {
				t.Errorf("Begin = %v, want it to wrap context.Canceled", err)
			}
			if tc.code == idem.ECodeFencingTokenStale && !errors.Is(c.Checkpoint(ctx, idem.Lease{Scope: scope, Token: 1}, "X"), idem.ErrFenced) {
				t.Error("409 FENCING_TOKEN_STALE is not errors.Is(idem.ErrFenced)")
			}
		})
	}
}

// Checkpoints an operation of these tests moves through (the engine's own
// are only RECEIVED and COMPLETED).
const (
	cpSent      idem.Checkpoint = "PROVIDER_REQUEST_SENT"
	cpConfirmed idem.Checkpoint = "PROVIDER_CONFIRMED"
)

package sidecar_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/sidecar"
)

// waitForRecord polls the record while it is in progress and fails unless
// it then has status st.
func (f *fixture) waitForRecord(t *testing.T, tenant, key string, st idem.Status) {
	t.Helper()
	for {
		rec, err := f.st.Get(context.Background(), idem.Scope{Tenant: tenant, Operation: "create_transfer", Key: key})
		if err != nil {
			t.Fatalf("record: %v", err)
		}
		if rec.Status != idem.StatusInProgress {
			if rec.Status != st {
				t.Fatalf("record settled %s, want %s", rec.Status, st)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitForReceived polls the upstream until it has received n requests
// under derived.
func (u *upstream) waitForReceived(derived string, n int) {
	for {
		if _, r := u.counts(); r[derived] >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientHangUpGetsAnswerOnRetry: a client whose own timeout ends before
// the upstream answers cancels nothing: the upstream call runs to its
// answer, which is stored, and the client's retry gets it, with the
// upstream called once.
func TestClientHangUpGetsAnswerOnRetry(t *testing.T) {
	f := newFixture(t, ";timeout=20s")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kh", 0)
	f.up.delay[derived] = 1500 * time.Millisecond
	impatient := &http.Client{Timeout: 200 * time.Millisecond}
	if a, err := f.send(t, impatient, "tok-a", "kh", "/transfers", "application/json", transfer); err == nil {
		t.Fatalf("the client's timeout did not end the call: %+v", a)
	}
	f.waitForRecord(t, "tenant-a", "kh", idem.StatusCompleted)
	a := f.mustSend(t, "kh", "application/json", transfer)
	if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %+v, want the stored 201", a)
	}
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 1 {
		t.Errorf("executions %v, received %v; want one", e, r)
	}
	if got := f.calls(t, "execute", "completed"); got != 1 {
		t.Errorf("completed calls = %v", got)
	}
}

// TestWaitOptionHoldsRetry: with wait=, a retry that finds its key in
// progress (an SDK retrying a timed-out call at once) is held until the
// first answer is stored and gets it; Prefer: wait=0 still asks for the
// 409 at once.
func TestWaitOptionHoldsRetry(t *testing.T) {
	f := newFixture(t, ";timeout=20s;wait=30s")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kw", 0)
	f.up.delay[derived] = time.Second
	var (
		wg    sync.WaitGroup
		first answer
		err   error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, err = f.send(t, http.DefaultClient, "tok-a", "kw", "/transfers", "application/json", transfer)
	}()
	f.up.waitForReceived(derived, 1)
	if a := f.mustSend(t, "kw", "application/json", transfer, "Prefer", "wait=0"); a.status != http.StatusConflict || a.code() != idem.ECodeInProgress {
		t.Errorf("Prefer: wait=0: %+v, want 409 %s", a, idem.ECodeInProgress)
	}
	held := f.mustSend(t, "kw", "application/json", transfer)
	wg.Wait()
	if err != nil || first.status != http.StatusCreated {
		t.Fatalf("first: %+v, %v", first, err)
	}
	if held.status != http.StatusCreated || held.body != first.body || held.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("held retry: %+v, want the first answer %+v", held, first)
	}
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 1 {
		t.Errorf("executions %v, received %v; want one", e, r)
	}
}

// TestKeptAliveConnectionNeverResends: connections to the upstream are
// reused, and a kept-alive connection that the upstream closes after
// reading a request is never a reason to send that request again, even
// one without a body (which net/http's transport would resend, taking its
// Idempotency-Key for a promise that a resend is harmless).
func TestKeptAliveConnectionNeverResends(t *testing.T) {
	f := newFixture(t, "")
	if a := f.mustSend(t, "warm", "", ""); a.status != http.StatusCreated {
		t.Fatalf("first: %+v", a)
	}
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kc", 0)
	f.up.hangUp[derived] = true
	if a := f.mustSend(t, "kc", "", ""); a.status != http.StatusAccepted || a.code() != idem.ECodeOutcomeUnknown {
		t.Fatalf("closed connection: %+v, want 202 %s", a, idem.ECodeOutcomeUnknown)
	}
	if _, r := f.up.counts(); r[derived] != 1 {
		t.Errorf("upstream received %d requests under the key, want 1", r[derived])
	}
	f.up.mu.Lock()
	remotes := append([]string(nil), f.up.remotes...)
	f.up.mu.Unlock()
	if len(remotes) != 2 || remotes[0] != remotes[1] {
		t.Errorf("upstream connections %v, want the second request on the first's connection", remotes)
	}
}

// TestPassAuthorizationAndReplayHeaders: pass-authorization gives the
// upstream the client's credential; replay-header= adds a stored header;
// Set-Cookie is never replayed unless named, and without the options
// neither happens.
func TestPassAuthorizationAndReplayHeaders(t *testing.T) {
	f := newFixture(t, ";pass-authorization;replay-header=X-Request-Id")
	first := f.mustSend(t, "ka", "application/json", transfer)
	if got := f.up.lastHeader().Get("Authorization"); got != "Bearer tok-a" {
		t.Errorf("upstream Authorization %q, want the client's", got)
	}
	replay := f.mustSend(t, "ka", "application/json", transfer)
	if replay.header.Get("X-Request-Id") == "" || replay.header.Get("X-Request-Id") != first.header.Get("X-Request-Id") {
		t.Errorf("replayed X-Request-Id %q, first %q", replay.header.Get("X-Request-Id"), first.header.Get("X-Request-Id"))
	}
	if v := replay.header.Values("Set-Cookie"); len(v) != 0 {
		t.Errorf("replay carries Set-Cookie %q", v)
	}

	plain := newFixture(t, "")
	plain.mustSend(t, "kp", "application/json", transfer)
	if got := plain.up.lastHeader().Values("Authorization"); len(got) != 0 {
		t.Errorf("upstream received Authorization %q by default", got)
	}
	if a := plain.mustSend(t, "kp", "application/json", transfer); a.header.Get("X-Request-Id") != "" || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("default replay: %+v", a)
	}
}

// TestUnknownStatus503: with unknown-status=503, a lost outcome answers a
// retryable 503 OUTCOME_UNKNOWN with Retry-After (an SDK that takes any
// status below 400 for success retries it instead of handing its caller
// an empty object), the record is UNKNOWN as with 202, and the upstream is
// not called again.
func TestUnknownStatus503(t *testing.T) {
	f := newFixture(t, ";unknown-status=503")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "ku5", 0)
	f.up.hangUp[derived] = true
	for i := range 2 {
		a := f.mustSend(t, "ku5", "application/json", transfer)
		if a.status != http.StatusServiceUnavailable || a.code() != idem.ECodeOutcomeUnknown || a.header.Get("Retry-After") == "" {
			t.Fatalf("attempt %d: %+v, want 503 %s with Retry-After", i, a, idem.ECodeOutcomeUnknown)
		}
	}
	if rec := f.record(t, "tenant-a", "ku5"); rec.Status != idem.StatusUnknown {
		t.Errorf("record %s, want UNKNOWN_REQUIRES_RECOVERY", rec.Status)
	}
	if _, r := f.up.counts(); r[derived] != 1 {
		t.Errorf("upstream received %d requests, want 1", r[derived])
	}
	// Without the option the contract's 202 stands.
	g := newFixture(t, "")
	g.up.hangUp[sidecar.DerivedKey("tenant-a", "create_transfer", "k202", 0)] = true
	if a := g.mustSend(t, "k202", "application/json", transfer); a.status != http.StatusAccepted {
		t.Errorf("default: %+v, want 202", a)
	}
}

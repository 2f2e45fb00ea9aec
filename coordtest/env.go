package coordtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

// env is what one check works with.
type env struct {
	t      *testing.T
	tg     Target
	c      idem.Coordinator
	ctx    context.Context
	prefix string
}

// scope returns the scope of the check's key name, under Tenant and
// Operation.
func (e *env) scope(name string) idem.Scope {
	return idem.Scope{Tenant: Tenant, Operation: Operation, Key: e.prefix + "-" + name}
}

// hashes returns the fingerprint of command as the engine would send it:
// the current version (2) first, then version 1 of the same command.
func hashes(command string) []string {
	sum := sha256.Sum256([]byte(command))
	h := hex.EncodeToString(sum[:])
	return []string{"v2:" + h, "v1:" + h}
}

// request is a Begin of scope for command, by owner.
func request(scope idem.Scope, command, owner string) idem.BeginRequest {
	return idem.BeginRequest{Scope: scope, RequestHashes: hashes(command), HashVersion: 2,
		Owner: owner, HomeRegion: "coordtest-region", LockFor: lockFor, Window: window}
}

// begin calls Begin and fails the check on an error.
func (e *env) begin(req idem.BeginRequest) idem.Decision {
	e.t.Helper()
	d, err := e.c.Begin(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Begin(%s, owner %q): %v", req.Key, req.Owner, err)
	}
	if d.Record == nil {
		e.t.Fatalf("Begin(%s) = %v without a Record", req.Key, d.Outcome)
	}
	return d
}

// expect calls Begin and fails the check unless it answers want; a lease
// is checked to be given exactly for the outcomes that take ownership.
func (e *env) expect(req idem.BeginRequest, want idem.Outcome) idem.Decision {
	e.t.Helper()
	d := e.begin(req)
	if d.Outcome != want {
		e.t.Fatalf("Begin(%s, owner %q) = %v (record %s, token %d), want %v", req.Key, req.Owner, d.Outcome, d.Record.Status, d.Record.FencingToken, want)
	}
	switch want {
	case idem.OutcomeExecute, idem.OutcomeRecover, idem.OutcomeExpired:
		if d.Lease.Scope != req.Scope || d.Lease.Token <= 0 {
			e.t.Fatalf("Begin(%s) = %v with lease %+v, want a lease of %+v with a positive token", req.Key, d.Outcome, d.Lease, req.Scope)
		}
		if d.Lease.Token != d.Record.FencingToken {
			e.t.Errorf("Begin(%s): lease token %d, record token %d; want them equal", req.Key, d.Lease.Token, d.Record.FencingToken)
		}
	default:
		if d.Lease != (idem.Lease{}) {
			e.t.Errorf("Begin(%s) = %v with lease %+v, want none", req.Key, d.Outcome, d.Lease)
		}
	}
	if d.ExpiredRetry != (want == idem.OutcomeExpired) {
		e.t.Errorf("Begin(%s) = %v with ExpiredRetry %v", req.Key, d.Outcome, d.ExpiredRetry)
	}
	return d
}

// claim begins a free key, which must answer execute.
func (e *env) claim(scope idem.Scope, command, owner string) idem.Decision {
	e.t.Helper()
	return e.expect(request(scope, command, owner), idem.OutcomeExecute)
}

// get returns scope's record, failing the check on an error.
func (e *env) get(scope idem.Scope) *idem.Record {
	e.t.Helper()
	rec, err := e.c.Get(e.ctx, scope)
	if err != nil {
		e.t.Fatalf("Get(%s): %v", scope.Key, err)
	}
	return rec
}

// absent fails the check unless scope has no record.
func (e *env) absent(scope idem.Scope) {
	e.t.Helper()
	if rec, err := e.c.Get(e.ctx, scope); !errors.Is(err, idem.ErrRecordNotFound) {
		e.t.Errorf("Get(%s) = %+v, %v; want an error matching idem.ErrRecordNotFound", scope.Key, rec, err)
	}
}

// age makes d pass for scope's record.
func (e *env) age(scope idem.Scope, d time.Duration) {
	e.t.Helper()
	e.tg.Age(scope, d)
}

// fenced fails the check unless every write under lease fails with
// idem.ErrFenced.
func (e *env) fenced(lease idem.Lease, why string) {
	e.t.Helper()
	if err := e.c.Checkpoint(e.ctx, lease, "coordtest.late"); !errors.Is(err, idem.ErrFenced) {
		e.t.Errorf("Checkpoint under %s = %v, want idem.ErrFenced", why, err)
	}
	if err := e.c.Complete(e.ctx, lease, idem.Completion{Response: idem.Response{Status: 200, Body: []byte("late")}}); !errors.Is(err, idem.ErrFenced) {
		e.t.Errorf("Complete under %s = %v, want idem.ErrFenced", why, err)
	}
	for _, st := range []idem.Status{idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown} {
		if err := e.c.Fail(e.ctx, lease, idem.Failure{Status: st, ErrorCode: "LATE"}); !errors.Is(err, idem.ErrFenced) {
			e.t.Errorf("Fail(%s) under %s = %v, want idem.ErrFenced", st, why, err)
		}
	}
}

// do fails the check if a write under lease fails.
func (e *env) do(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// near reports whether got is within slack of want.
func near(got, want time.Time) bool {
	d := got.Sub(want)
	return d >= -slack && d <= slack
}

// held checks that rec is IN_PROGRESS under a lock of lockFor from its
// last write, owned by owner with the given attempts.
func (e *env) held(rec *idem.Record, owner string, attempts int) {
	e.t.Helper()
	if rec.Status != idem.StatusInProgress || rec.Owner != owner || rec.Attempts != attempts {
		e.t.Errorf("record %s: %s, owner %q, attempts %d; want IN_PROGRESS, owner %q, attempts %d",
			rec.Key, rec.Status, rec.Owner, rec.Attempts, owner, attempts)
	}
	if rec.LockedUntil == nil || !near(*rec.LockedUntil, rec.UpdatedAt.Add(lockFor)) {
		e.t.Errorf("record %s: locked until %v, updated at %v; want locked for %v from its update", rec.Key, rec.LockedUntil, rec.UpdatedAt, lockFor)
	}
}

// fresh checks a record just inserted for req.
func (e *env) fresh(rec *idem.Record, req idem.BeginRequest, checkpoint idem.Checkpoint) {
	e.t.Helper()
	if rec.Scope != req.Scope {
		e.t.Errorf("record scope %+v, want %+v", rec.Scope, req.Scope)
	}
	if rec.RequestHash != req.RequestHashes[0] || rec.HashVersion != req.HashVersion {
		e.t.Errorf("record hash %q version %d, want %q version %d", rec.RequestHash, rec.HashVersion, req.RequestHashes[0], req.HashVersion)
	}
	if rec.Checkpoint != checkpoint {
		e.t.Errorf("record checkpoint %s, want %s", rec.Checkpoint, checkpoint)
	}
	e.held(rec, req.Owner, 1)
	if rec.Generation != 0 || rec.FencingToken <= 0 {
		e.t.Errorf("record generation %d, token %d; want 0 and a positive token", rec.Generation, rec.FencingToken)
	}
	if rec.Response != nil || rec.ResourceType != "" || rec.ResourceID != "" || rec.ErrorCode != "" {
		e.t.Errorf("new record has an outcome: response %+v, resource %q %q, error code %q", rec.Response, rec.ResourceType, rec.ResourceID, rec.ErrorCode)
	}
	if rec.CreatedAt.IsZero() || rec.UpdatedAt.Before(rec.CreatedAt) || !near(rec.ExpiresAt, rec.CreatedAt.Add(window)) {
		e.t.Errorf("record created %v, updated %v, expires %v; want it to expire %v after its creation", rec.CreatedAt, rec.UpdatedAt, rec.ExpiresAt, window)
	}
}

// same fails the check unless got and want describe the same record state.
func (e *env) same(got, want *idem.Record, what string) {
	e.t.Helper()
	if got.Scope != want.Scope || got.Status != want.Status || got.Checkpoint != want.Checkpoint ||
		got.FencingToken != want.FencingToken || got.Owner != want.Owner || got.Attempts != want.Attempts ||
		got.Generation != want.Generation || got.RequestHash != want.RequestHash || got.ErrorCode != want.ErrorCode ||
		got.ResourceType != want.ResourceType || got.ResourceID != want.ResourceID ||
		!sameTime(got.LockedUntil, want.LockedUntil) || !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		e.t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
	e.sameResponse(got.Response, want.Response, what)
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// sameResponse fails the check unless got is want: status, schema
// version, headers and body (nil and empty alike).
func (e *env) sameResponse(got, want *idem.Response, what string) {
	e.t.Helper()
	if got == nil || want == nil {
		if got != want {
			e.t.Errorf("%s: response %+v, want %+v", what, got, want)
		}
		return
	}
	if got.Status != want.Status || got.SchemaVersion != want.SchemaVersion || !bytes.Equal(got.Body, want.Body) || !maps.Equal(got.Headers, want.Headers) {
		e.t.Errorf("%s: response %d %q %v %q, want %d %q %v %q", what,
			got.Status, got.SchemaVersion, got.Headers, got.Body, want.Status, want.SchemaVersion, want.Headers, want.Body)
	}
}

package coordtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/idemcoord/idem"
)

// checkClaim: a free key is the caller's, at RECEIVED, and Get shows the
// record Begin returned.
func checkClaim(e *env) {
	s := e.scope("k")
	e.absent(s)
	req := request(s, "command", "owner-1")
	d := e.expect(req, idem.OutcomeExecute)
	if d.Lease.Owner != "owner-1" {
		e.t.Errorf("lease owner %q, want owner-1", d.Lease.Owner)
	}
	e.fresh(d.Record, req, idem.CheckpointReceived)
	e.same(e.get(s), d.Record, "Get after the claim")
}

// checkStartAt: a free key's record starts at StartAt; a takeover keeps
// the checkpoint the record had.
func checkStartAt(e *env) {
	s := e.scope("k")
	req := request(s, "command", "owner-1")
	req.StartAt = "coordtest.started"
	d := e.expect(req, idem.OutcomeExecute)
	want := req.StartAt
	if e.tg.IgnoresStartAt && d.Record.Checkpoint == idem.CheckpointReceived {
		want = idem.CheckpointReceived
	}
	e.fresh(d.Record, req, want)
	if got := e.get(s).Checkpoint; got != want {
		e.t.Errorf("Get: checkpoint %s, want %s", got, want)
	}
	e.do("Fail retryable", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusFailedRetryable}))
	retry := request(s, "command", "owner-2")
	retry.StartAt = "coordtest.other-start"
	if got := e.expect(retry, idem.OutcomeRecover).Record.Checkpoint; got != want {
		e.t.Errorf("takeover with another StartAt: checkpoint %s, want %s (the record's)", got, want)
	}
}

// checkInProgress: while the owner holds the key, the same command
// answers in progress and another command a conflict; neither changes
// the record.
func checkInProgress(e *env) {
	s := e.scope("k")
	first := e.claim(s, "command", "owner-1")
	d := e.expect(request(s, "command", "owner-2"), idem.OutcomeInProgress)
	if d.Record.Owner != "owner-1" || d.Record.FencingToken != first.Lease.Token || d.Record.Status != idem.StatusInProgress {
		e.t.Errorf("in progress: record owner %q, token %d, %s; want the holder's (owner-1, token %d, IN_PROGRESS)",
			d.Record.Owner, d.Record.FencingToken, d.Record.Status, first.Lease.Token)
	}
	d = e.expect(request(s, "other command", "owner-3"), idem.OutcomeConflict)
	if d.Record.RequestHash != first.Record.RequestHash {
		e.t.Errorf("conflict: record hash %q, want the first command's %q", d.Record.RequestHash, first.Record.RequestHash)
	}
	e.same(e.get(s), first.Record, "Get after an in-progress and a conflicting Begin")
}

// checkConcurrentClaims: of many Begins of one free key at once, exactly
// one executes; the others see it in progress.
func checkConcurrentClaims(e *env) {
	s := e.scope("k")
	const n = 16
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		ds    [n]idem.Decision
		errs  [n]error
	)
	for i := range n {
		wg.Go(func() {
			<-start
			ds[i], errs[i] = e.c.Begin(e.ctx, request(s, "command", fmt.Sprintf("owner-%d", i)))
		})
	}
	close(start)
	wg.Wait()
	var winner *idem.Decision
	for i := range n {
		switch {
		case errs[i] != nil:
			e.t.Errorf("Begin %d: %v", i, errs[i])
		case ds[i].Outcome == idem.OutcomeExecute:
			if winner != nil {
				e.t.Errorf("Begins %s and %s both execute", winner.Lease.Owner, ds[i].Lease.Owner)
			}
			winner = &ds[i]
		case ds[i].Outcome != idem.OutcomeInProgress || ds[i].Lease != (idem.Lease{}):
			e.t.Errorf("Begin %d = %v with lease %+v, want in progress without a lease", i, ds[i].Outcome, ds[i].Lease)
		}
	}
	if winner == nil {
		e.t.Fatal("no Begin executes")
	}
	if rec := e.get(s); rec.Owner != winner.Lease.Owner || rec.FencingToken != winner.Lease.Token || rec.Attempts != 1 {
		e.t.Errorf("record owner %q, token %d, attempts %d; want the winner's (%q, %d) and 1", rec.Owner, rec.FencingToken, rec.Attempts, winner.Lease.Owner, winner.Lease.Token)
	}
}

// checkGet: Get of a key without a record fails with ErrRecordNotFound;
// the records Get and Begin return are copies.
func checkGet(e *env) {
	s := e.scope("k")
	e.absent(s)
	d := e.claim(s, "command", "owner-1")
	resp := idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "text/plain"}, Body: []byte("done"), SchemaVersion: "v1"}
	e.do("Complete", e.c.Complete(e.ctx, d.Lease, idem.Completion{Response: resp}))
	want := e.get(s)
	for _, rec := range []*idem.Record{e.get(s), e.expect(request(s, "command", "owner-2"), idem.OutcomeReplay).Record} {
		rec.Status, rec.FencingToken = idem.StatusUnknown, 99
		if rec.Response != nil {
			if len(rec.Response.Body) > 0 {
				rec.Response.Body[0] = 'X'
			}
			if rec.Response.Headers != nil {
				rec.Response.Headers["Content-Type"] = "changed"
			}
		}
	}
	e.same(e.get(s), want, "Get after changing returned records")
	e.sameResponse(e.get(s).Response, &resp, "stored response")
}

// checkOperations: the same key under two operations is two records.
func checkOperations(e *env) {
	s := e.scope("k")
	other := s
	other.Operation = OtherOperation
	d := e.claim(s, "command", "owner-1")
	e.absent(other)
	o := e.claim(other, "command", "owner-2")
	e.do("Complete", e.c.Complete(e.ctx, o.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("other")}}))
	if rec := e.get(s); rec.Status != idem.StatusInProgress || rec.Owner != "owner-1" || rec.FencingToken != d.Lease.Token {
		e.t.Errorf("record of %s after %s's completed: %s, owner %q; want it untouched", Operation, OtherOperation, rec.Status, rec.Owner)
	}
	if rec := e.get(other); rec.Operation != OtherOperation || rec.Status != idem.StatusCompleted {
		e.t.Errorf("record of %s: %+v", OtherOperation, rec)
	}
}

// checkTenants: the same key in two tenants is two records.
func checkTenants(e *env) {
	s := e.scope("k")
	other := s
	other.Tenant = OtherTenant
	e.claim(s, "command", "owner-1")
	e.absent(other)
	o := e.claim(other, "another command", "owner-2")
	if rec := e.get(other); rec.Tenant != OtherTenant || rec.Owner != "owner-2" || rec.RequestHash != o.Record.RequestHash {
		e.t.Errorf("record of %s: %+v", OtherTenant, rec)
	}
	if rec := e.get(s); rec.Tenant != Tenant || rec.Owner != "owner-1" {
		e.t.Errorf("record of %s: %+v", Tenant, rec)
	}
}

// checkInvalid: what the store refuses is refused with its codes, and
// creates no record.
func checkInvalid(e *env) {
	s := e.scope("k")
	for _, key := range []string{"", "with space", "caf\u00e9", strings.Repeat("k", 256), ".", ".."} {
		req := request(idem.Scope{Tenant: Tenant, Operation: Operation, Key: key}, "command", "owner")
		if _, err := e.c.Begin(e.ctx, req); idem.ErrorCode(err) != idem.ECodeKeyInvalid {
			e.t.Errorf("Begin with key %q: %v, want %s", key, err, idem.ECodeKeyInvalid)
		}
	}
	type mod struct {
		what string
		set  func(*idem.BeginRequest)
		skip bool
	}
	for _, m := range []mod{
		{"no operation", func(r *idem.BeginRequest) { r.Operation = "" }, false},
		{"no tenant", func(r *idem.BeginRequest) { r.Tenant = "" }, e.tg.OneTenant},
		{"no request hash", func(r *idem.BeginRequest) { r.RequestHashes = nil }, false},
		{"an empty request hash", func(r *idem.BeginRequest) { r.RequestHashes = []string{""} }, false},
		{"no lock duration", func(r *idem.BeginRequest) { r.LockFor = 0 }, false},
		{"a negative lock duration", func(r *idem.BeginRequest) { r.LockFor = -lockFor }, false},
		{"no window", func(r *idem.BeginRequest) { r.Window = 0 }, false},
		{"StartAt COMPLETED", func(r *idem.BeginRequest) { r.StartAt = idem.CheckpointCompleted }, e.tg.IgnoresStartAt},
		{"a StartAt of 65 bytes", func(r *idem.BeginRequest) { r.StartAt = idem.Checkpoint(strings.Repeat("c", 65)) }, e.tg.IgnoresStartAt},
	} {
		if m.skip {
			continue
		}
		req := request(s, "command", "owner")
		m.set(&req)
		if _, err := e.c.Begin(e.ctx, req); idem.ErrorCode(err) != idem.ECodeValidationFailed {
			e.t.Errorf("Begin with %s: %v, want %s", m.what, err, idem.ECodeValidationFailed)
		}
	}
	e.absent(s)
}

// checkCancelled: a Begin whose context is already done fails and
// claims nothing.
func checkCancelled(e *env) {
	s := e.scope("k")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if d, err := e.c.Begin(ctx, request(s, "command", "owner-1")); err == nil {
		e.t.Errorf("Begin with a cancelled context = %v, want an error", d.Outcome)
	}
	e.absent(s)
	d := e.claim(s, "command", "owner-2")
	if err := e.c.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201}}); err == nil || errors.Is(err, idem.ErrFenced) {
		e.t.Errorf("Complete with a cancelled context = %v, want an error other than ErrFenced", err)
	}
	if rec := e.get(s); rec.Status != idem.StatusInProgress {
		e.t.Errorf("record after a cancelled Complete: %s, want IN_PROGRESS", rec.Status)
	}
}

// checkClaimSentAgain: a Begin sent again under its ClaimID (its first
// answer lost) gets its own lease back while the record is open, the
// record unchanged: Execute while the record is as that claim inserted
// it, Recover once its owner has checkpointed. Another claim id, or none,
// finds the key in progress, and a settled record answers a replay to the
// claim as to anyone. A takeover's claim id is the record's from then on.
func checkClaimSentAgain(e *env) {
	const mine, other = "coordtest-claim-00000001", "coordtest-claim-00000002"
	s := e.scope("k")
	req := request(s, "command", "owner-1")
	req.ClaimID = mine
	first := e.expect(req, idem.OutcomeExecute)
	e.fresh(first.Record, req, idem.CheckpointReceived)
	again := e.expect(req, idem.OutcomeExecute)
	e.sameLease(again, first, "the claim sent again")
	e.same(again.Record, first.Record, "the record of the claim sent again")

	stranger := request(s, "command", "owner-2")
	stranger.ClaimID = other
	e.expect(stranger, idem.OutcomeInProgress)
	e.expect(request(s, "command", "owner-3"), idem.OutcomeInProgress)

	e.do("Checkpoint", e.c.Checkpoint(e.ctx, first.Lease, "coordtest.sent"))
	resumed := e.expect(req, idem.OutcomeRecover)
	e.sameLease(resumed, first, "the claim sent again after a checkpoint")
	if resumed.Record.Checkpoint != "coordtest.sent" || resumed.Record.Attempts != 1 {
		e.t.Errorf("the claim sent again after a checkpoint: record at %s, attempts %d; want coordtest.sent, 1",
			resumed.Record.Checkpoint, resumed.Record.Attempts)
	}
	e.do("Complete", e.c.Complete(e.ctx, first.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("once")}}))
	if d := e.expect(req, idem.OutcomeReplay); d.Record.Response == nil || string(d.Record.Response.Body) != "once" {
		e.t.Errorf("the claim sent again after it completed: response %+v, want the stored one", d.Record.Response)
	}

	// A record taken over under a claim id is that claim's: sent again, it
	// gets the takeover's lease, not another one.
	u := e.scope("taken")
	d := e.claim(u, "command", "owner-1")
	e.do("Fail", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: "DOWNSTREAM_BUSY"}))
	take := request(u, "command", "owner-2")
	take.ClaimID = other
	taken := e.expect(take, idem.OutcomeRecover)
	e.sameLease(e.expect(take, idem.OutcomeRecover), taken, "the takeover sent again")
	mineAgain := request(u, "command", "owner-1")
	mineAgain.ClaimID = mine
	e.expect(mineAgain, idem.OutcomeInProgress)
}

// sameLease fails the check unless got hands back want's lease.
func (e *env) sameLease(got, want idem.Decision, what string) {
	e.t.Helper()
	if got.Lease.Scope != want.Lease.Scope || got.Lease.Token != want.Lease.Token {
		e.t.Errorf("%s: lease %+v, want %+v", what, got.Lease, want.Lease)
	}
}

package coordtest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/idemcoord/idem"
)

// takenOver checks a Recover decision against the record before it:
// higher token, the new owner, one more attempt, the old checkpoint, a
// new lock.
func (e *env) takenOver(d idem.Decision, before *idem.Record, owner string) {
	e.t.Helper()
	if d.Lease.Token <= before.FencingToken {
		e.t.Errorf("takeover token %d, want above the previous %d", d.Lease.Token, before.FencingToken)
	}
	if d.Lease.Owner != owner {
		e.t.Errorf("takeover lease owner %q, want %q", d.Lease.Owner, owner)
	}
	e.held(d.Record, owner, before.Attempts+1)
	if d.Record.Checkpoint != before.Checkpoint || d.Record.Generation != before.Generation || d.Record.RequestHash != before.RequestHash {
		e.t.Errorf("taken over record at %s, generation %d, hash %q; want %s, %d, %q as before",
			d.Record.Checkpoint, d.Record.Generation, d.Record.RequestHash, before.Checkpoint, before.Generation, before.RequestHash)
	}
	e.same(e.get(d.Lease.Scope), d.Record, "Get after the takeover")
}

// finish completes under lease and checks that the key then replays.
func (e *env) finish(lease idem.Lease, body string) {
	e.t.Helper()
	e.do("Complete under the new lease", e.c.Complete(e.ctx, lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(body)}}))
	replay := e.expect(request(lease.Scope, "command", "owner-late"), idem.OutcomeReplay)
	if replay.Record.Response == nil || string(replay.Record.Response.Body) != body || replay.Record.FencingToken != lease.Token {
		e.t.Errorf("replay after the new owner completed: token %d, response %+v; want token %d, body %q", replay.Record.FencingToken, replay.Record.Response, lease.Token, body)
	}
}

// checkFailRetryable: a failure before any side effect is not replayed: a
// retry takes the record over and executes again.
func checkFailRetryable(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	e.do("Fail", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: "DOWNSTREAM_BUSY"}))
	rec := e.get(s)
	if rec.Status != idem.StatusFailedRetryable || rec.ErrorCode != "DOWNSTREAM_BUSY" || rec.LockedUntil != nil || rec.Checkpoint != idem.CheckpointReceived {
		e.t.Errorf("failed record: %+v; want FAILED_RETRYABLE, DOWNSTREAM_BUSY, no lock, at RECEIVED", rec)
	}
	e.fenced(d.Lease, "the lease of a retryable failure")
	e.expect(request(s, "other command", "owner-x"), idem.OutcomeConflict)
	retry := e.expect(request(s, "command", "owner-2"), idem.OutcomeRecover)
	e.takenOver(retry, rec, "owner-2")
	e.expect(request(s, "command", "owner-3"), idem.OutcomeInProgress)
	e.fenced(d.Lease, "the first owner's lease after a takeover")
	e.finish(retry.Lease, "second attempt")
}

// checkFailUnknown: an outcome lost after a side effect leaves the record
// to recovery: a retry takes it over at the checkpoint the owner reached.
func checkFailUnknown(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	e.do("Checkpoint", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
	e.do("Fail", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusUnknown, ErrorCode: "OUTCOME_UNKNOWN"}))
	rec := e.get(s)
	if rec.Status != idem.StatusUnknown || rec.ErrorCode != "OUTCOME_UNKNOWN" || rec.LockedUntil != nil || rec.Checkpoint != "coordtest.sent" {
		e.t.Errorf("unknown record: %+v; want UNKNOWN_REQUIRES_RECOVERY, OUTCOME_UNKNOWN, no lock, at coordtest.sent", rec)
	}
	e.expect(request(s, "other command", "owner-x"), idem.OutcomeConflict)
	// Until someone takes it over, the record still takes its owner's
	// writes (an answer that arrives late).
	e.do("Checkpoint of an unknown record by its owner", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
	if got := e.get(s); got.Status != idem.StatusUnknown || got.FencingToken != d.Lease.Token {
		e.t.Errorf("unknown record after its owner's checkpoint: %s, token %d; want UNKNOWN_REQUIRES_RECOVERY under %d", got.Status, got.FencingToken, d.Lease.Token)
	}
	retry := e.expect(request(s, "command", "owner-2"), idem.OutcomeRecover)
	e.takenOver(retry, rec, "owner-2")
	e.fenced(d.Lease, "the first owner's lease after a takeover")
	e.finish(retry.Lease, "found downstream")

	late := e.scope("late")
	d = e.claim(late, "command", "owner-1")
	e.do("Fail", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusUnknown}))
	e.finish(d.Lease, "the late answer")
}

// checkStale: a lock that ran out is taken over by the same command's
// retry, once; the old owner is fenced off.
func checkStale(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	e.do("Checkpoint", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
	e.age(s, lockFor/2)
	e.expect(request(s, "command", "owner-2"), idem.OutcomeInProgress)
	e.age(s, lockFor)
	e.expect(request(s, "other command", "owner-x"), idem.OutcomeConflict)
	before := e.get(s)
	if before.Status != idem.StatusInProgress || before.FencingToken != d.Lease.Token {
		e.t.Fatalf("stale record: %s, token %d; want IN_PROGRESS under %d", before.Status, before.FencingToken, d.Lease.Token)
	}
	retry := e.expect(request(s, "command", "owner-2"), idem.OutcomeRecover)
	e.takenOver(retry, before, "owner-2")
	e.expect(request(s, "command", "owner-3"), idem.OutcomeInProgress)
	e.fenced(d.Lease, "a stale owner's lease")
	e.finish(retry.Lease, "recovered")
}

// checkConcurrentTakeovers: of many retries of one stale record at once,
// exactly one takes it over.
func checkConcurrentTakeovers(e *env) {
	s := e.scope("k")
	first := e.claim(s, "command", "owner-0")
	e.age(s, 2*lockFor)
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
			ds[i], errs[i] = e.c.Begin(e.ctx, request(s, "command", fmt.Sprintf("owner-%d", i+1)))
		})
	}
	close(start)
	wg.Wait()
	var winner *idem.Decision
	for i := range n {
		switch {
		case errs[i] != nil:
			e.t.Errorf("Begin %d: %v", i, errs[i])
		case ds[i].Outcome == idem.OutcomeRecover && ds[i].Lease.Token > 0:
			if winner != nil {
				e.t.Errorf("Begins %s (token %d) and %s (token %d) both take the record over",
					winner.Lease.Owner, winner.Lease.Token, ds[i].Lease.Owner, ds[i].Lease.Token)
			}
			winner = &ds[i]
		case ds[i].Outcome != idem.OutcomeInProgress || ds[i].Lease != (idem.Lease{}):
			e.t.Errorf("Begin %d = %v with lease %+v, want in progress without a lease", i, ds[i].Outcome, ds[i].Lease)
		}
	}
	if winner == nil {
		e.t.Fatal("no Begin takes the stale record over")
	}
	rec := e.get(s)
	if rec.Owner != winner.Lease.Owner || rec.FencingToken != winner.Lease.Token || rec.FencingToken <= first.Lease.Token || rec.Attempts != 2 {
		e.t.Errorf("record owner %q, token %d, attempts %d; want the winner's (%q, %d above %d) and 2",
			rec.Owner, rec.FencingToken, rec.Attempts, winner.Lease.Owner, winner.Lease.Token, first.Lease.Token)
	}
}

// checkExternalFencing: with ExternalFencing, a takeover without a token
// reports recover and takes nothing; with the external lock's token it
// takes the record only if that token is higher than the record's, and
// the record then carries it.
func checkExternalFencing(e *env) {
	s := e.scope("k")
	ext := func(owner string, token int64) idem.BeginRequest {
		req := request(s, "command", owner)
		req.ExternalFencing, req.FencingToken = true, token
		return req
	}
	d := e.expect(ext("owner-1", 0), idem.OutcomeExecute)
	e.do("Checkpoint", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
	e.age(s, 2*lockFor)
	before := e.get(s)

	probe := e.begin(ext("owner-2", 0))
	if probe.Outcome != idem.OutcomeRecover || probe.Lease != (idem.Lease{}) {
		e.t.Errorf("takeover without a token: %v with lease %+v, want recover without a lease", probe.Outcome, probe.Lease)
	}
	if probe.Record.FencingToken != d.Lease.Token || probe.Record.Checkpoint != "coordtest.sent" {
		e.t.Errorf("recover without a token: record token %d at %s, want %d at coordtest.sent", probe.Record.FencingToken, probe.Record.Checkpoint, d.Lease.Token)
	}
	e.same(e.get(s), before, "Get after a recover without a token")

	if _, err := e.c.Begin(e.ctx, ext("owner-2", d.Lease.Token)); !errors.Is(err, idem.ErrFenced) {
		e.t.Errorf("takeover with the record's own token: %v, want idem.ErrFenced", err)
	}
	e.same(e.get(s), before, "Get after a takeover with a token not above the record's")

	token := d.Lease.Token + 100
	retry := e.expect(ext("owner-2", token), idem.OutcomeRecover)
	if retry.Lease.Token != token {
		e.t.Errorf("takeover with external token %d: lease token %d", token, retry.Lease.Token)
	}
	e.takenOver(retry, before, "owner-2")
	e.fenced(d.Lease, "the first owner's lease after an external takeover")
	e.expect(ext("owner-3", token+100), idem.OutcomeInProgress)

	// Released again: a token below the record's (an older lock) is fenced.
	e.do("Fail", e.c.Fail(e.ctx, retry.Lease, idem.Failure{Status: idem.StatusFailedRetryable}))
	if _, err := e.c.Begin(e.ctx, ext("owner-3", token-1)); !errors.Is(err, idem.ErrFenced) {
		e.t.Errorf("takeover with a token below the record's: %v, want idem.ErrFenced", err)
	}
	again := e.expect(ext("owner-3", token+1), idem.OutcomeRecover)
	if again.Lease.Token != token+1 || again.Record.Attempts != 3 {
		e.t.Errorf("second external takeover: token %d, attempts %d; want %d and 3", again.Lease.Token, again.Record.Attempts, token+1)
	}
	e.finish(again.Lease, "settled under the external lock")
}

// checkExpiry: a settled record past its window is a new operation,
// whatever the command: a new generation at RECEIVED, under a higher token,
// with nothing of the old outcome.
func checkExpiry(e *env) {
	type kind struct {
		name   string
		settle func(idem.Lease) error
	}
	for _, k := range []kind{
		{"completed", func(l idem.Lease) error {
			return e.c.Complete(e.ctx, l, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("old")}, ResourceType: "transfer", ResourceID: "tr_old"})
		}},
		{"failed-replayable", func(l idem.Lease) error {
			return e.c.Fail(e.ctx, l, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: "REJECTED", Response: &idem.Response{Status: 422, Body: []byte("old")}})
		}},
		{"failed-retryable", func(l idem.Lease) error {
			return e.c.Fail(e.ctx, l, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: "BUSY"})
		}},
	} {
		s := e.scope(k.name)
		d := e.claim(s, "command", "owner-1")
		e.do("Checkpoint", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
		e.do("settle "+k.name, k.settle(d.Lease))
		old := e.get(s)
		e.age(s, window+lockFor)
		for i, command := range []string{"another command", "command"} {
			if i == 1 {
				// The same command after the window is a new operation
				// too: settle the new generation and age it out again.
				e.age(s, window+lockFor)
				old = e.get(s)
			}
			req := request(s, command, fmt.Sprintf("owner-%d", i+2))
			req.StartAt = "coordtest.started" // takeovers do not use it
			n := e.expect(req, idem.OutcomeExpired)
			rec := n.Record
			if n.Lease.Token <= old.FencingToken {
				e.t.Errorf("%s: expiry takeover token %d, want above %d", k.name, n.Lease.Token, old.FencingToken)
			}
			e.held(rec, req.Owner, 1)
			if rec.Generation != old.Generation+1 || rec.Checkpoint != idem.CheckpointReceived || rec.RequestHash != req.RequestHashes[0] ||
				rec.Response != nil || rec.ResourceID != "" || rec.ResourceType != "" || rec.ErrorCode != "" {
				e.t.Errorf("%s: record after expiry: %+v; want generation %d at RECEIVED for the new command, with no outcome", k.name, rec, old.Generation+1)
			}
			if !rec.CreatedAt.After(old.CreatedAt) || !near(rec.ExpiresAt, rec.CreatedAt.Add(window)) {
				e.t.Errorf("%s: new generation created %v (old %v), expires %v; want a new window", k.name, rec.CreatedAt, old.CreatedAt, rec.ExpiresAt)
			}
			e.same(e.get(s), rec, k.name+": Get after expiry")
			e.fenced(d.Lease, "the old generation's lease")
			e.expect(request(s, command, "owner-x"), idem.OutcomeInProgress)
			e.do("Complete the new generation", e.c.Complete(e.ctx, n.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(command)}}))
			if r := e.expect(request(s, command, "owner-y"), idem.OutcomeReplay).Record; r.Response == nil || string(r.Response.Body) != command {
				e.t.Errorf("%s: replay of the new generation: %+v", k.name, r.Response)
			}
			d = n
		}
	}
}

// checkNoExpiry: a record still IN_PROGRESS or UNKNOWN past its window is
// never forgotten: a retry recovers it, in its generation.
func checkNoExpiry(e *env) {
	held := e.scope("in-progress")
	d := e.claim(held, "command", "owner-1")
	e.do("Checkpoint", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.sent"))
	unknown := e.scope("unknown")
	u := e.claim(unknown, "command", "owner-1")
	e.do("Checkpoint", e.c.Checkpoint(e.ctx, u.Lease, "coordtest.sent"))
	e.do("Fail", e.c.Fail(e.ctx, u.Lease, idem.Failure{Status: idem.StatusUnknown}))
	e.age(held, window+lockFor)
	e.age(unknown, window+lockFor)
	for _, s := range []idem.Scope{held, unknown} {
		before := e.get(s)
		e.expect(request(s, "another command", "owner-x"), idem.OutcomeConflict)
		retry := e.expect(request(s, "command", "owner-2"), idem.OutcomeRecover)
		e.takenOver(retry, before, "owner-2")
	}
}

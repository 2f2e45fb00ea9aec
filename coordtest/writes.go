package coordtest

import (
	"github.com/idemcoord/idem"
)

// checkCompleteReplay: a completed record answers the same command with
// its response and another with a conflict; its owner can write no more.
func checkCompleteReplay(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	resp := idem.Response{Status: 201, SchemaVersion: "v3",
		Headers: map[string]string{"Content-Type": "application/json", "Location": "/transfers/tr_1"},
		Body:    []byte(`{"id":"tr_1","amount":"10.00"}`)}
	e.do("Complete", e.c.Complete(e.ctx, d.Lease, idem.Completion{Response: resp, ResourceType: "transfer", ResourceID: "tr_1"}))
	rec := e.get(s)
	if rec.Status != idem.StatusCompleted || rec.Checkpoint != idem.CheckpointCompleted || rec.LockedUntil != nil ||
		rec.FencingToken != d.Lease.Token || rec.ResourceType != "transfer" || rec.ResourceID != "tr_1" || rec.ErrorCode != "" {
		e.t.Errorf("completed record: %+v; want COMPLETED at COMPLETED, no lock, token %d, resource transfer tr_1", rec, d.Lease.Token)
	}
	if rec.UpdatedAt.Before(d.Record.UpdatedAt) {
		e.t.Errorf("completed record updated at %v, before its claim's %v", rec.UpdatedAt, d.Record.UpdatedAt)
	}
	e.sameResponse(rec.Response, &resp, "Get of the completed record")
	replay := e.expect(request(s, "command", "owner-2"), idem.OutcomeReplay)
	e.sameResponse(replay.Record.Response, &resp, "replay")
	if replay.Record.Status != idem.StatusCompleted {
		e.t.Errorf("replay: record %s, want COMPLETED", replay.Record.Status)
	}
	e.expect(request(s, "other command", "owner-3"), idem.OutcomeConflict)
	e.fenced(d.Lease, "the lease of a completed record")
	e.same(e.get(s), rec, "Get after late writes")
}

// checkHashVersions: a record stored under an older hash version replays
// to a request that carries that version's hash after its current one,
// and conflicts with another command's hashes.
func checkHashVersions(e *env) {
	s := e.scope("k")
	h := hashes("command")
	old := request(s, "command", "owner-1")
	old.RequestHashes, old.HashVersion = h[1:], 1
	d := e.expect(old, idem.OutcomeExecute)
	if d.Record.RequestHash != h[1] || d.Record.HashVersion != 1 {
		e.t.Errorf("record hash %q version %d, want %q version 1", d.Record.RequestHash, d.Record.HashVersion, h[1])
	}
	e.do("Complete", e.c.Complete(e.ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 200, Body: []byte("v1 record")}}))
	replay := e.expect(request(s, "command", "owner-2"), idem.OutcomeReplay)
	if replay.Record.Response == nil || string(replay.Record.Response.Body) != "v1 record" {
		e.t.Errorf("replay under the current version: response %+v", replay.Record.Response)
	}
	e.expect(request(s, "other command", "owner-3"), idem.OutcomeConflict)
}

// checkCheckpoint: the owner records progress; a retry sees it.
func checkCheckpoint(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	for _, cp := range []idem.Checkpoint{"coordtest.debited", "coordtest.sent"} {
		e.do("Checkpoint "+string(cp), e.c.Checkpoint(e.ctx, d.Lease, cp))
		rec := e.get(s)
		if rec.Checkpoint != cp || rec.Status != idem.StatusInProgress || rec.FencingToken != d.Lease.Token || rec.Owner != "owner-1" {
			e.t.Errorf("after Checkpoint %s: %s at %s, token %d, owner %q", cp, rec.Status, rec.Checkpoint, rec.FencingToken, rec.Owner)
		}
		if rec.UpdatedAt.Before(d.Record.UpdatedAt) {
			e.t.Errorf("after Checkpoint %s: updated at %v, before the claim's %v", cp, rec.UpdatedAt, d.Record.UpdatedAt)
		}
	}
	if got := e.expect(request(s, "command", "owner-2"), idem.OutcomeInProgress).Record.Checkpoint; got != "coordtest.sent" {
		e.t.Errorf("retry sees checkpoint %s, want coordtest.sent", got)
	}
}

// checkFenced: a lease with another token, or of a key without a record,
// writes nothing.
func checkFenced(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	higher := d.Lease
	higher.Token++
	e.fenced(higher, "a token the record never granted")
	none := d.Lease
	none.Scope = e.scope("no-record")
	e.fenced(none, "a lease of a key without a record")
	e.absent(none.Scope)
	e.same(e.get(s), d.Record, "Get after fenced writes")
	e.do("Checkpoint under the right lease", e.c.Checkpoint(e.ctx, d.Lease, "coordtest.step"))
}

// checkFailReplayable: a deterministic rejection is stored and replayed
// like a success; its owner can write no more.
func checkFailReplayable(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	resp := idem.Response{Status: 422, Headers: map[string]string{"Content-Type": "application/problem+json"},
		Body: []byte(`{"errorCode":"INSUFFICIENT_FUNDS"}`), SchemaVersion: "v1"}
	e.do("Fail", e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: "INSUFFICIENT_FUNDS", Response: &resp}))
	rec := e.get(s)
	if rec.Status != idem.StatusFailedReplayable || rec.ErrorCode != "INSUFFICIENT_FUNDS" || rec.LockedUntil != nil || rec.FencingToken != d.Lease.Token {
		e.t.Errorf("failed record: %+v; want FAILED_REPLAYABLE, INSUFFICIENT_FUNDS, no lock, token %d", rec, d.Lease.Token)
	}
	e.sameResponse(rec.Response, &resp, "Get of the failed record")
	replay := e.expect(request(s, "command", "owner-2"), idem.OutcomeReplay)
	e.sameResponse(replay.Record.Response, &resp, "replay of the failure")
	if replay.Record.Status != idem.StatusFailedReplayable || replay.Record.ErrorCode != "INSUFFICIENT_FUNDS" {
		e.t.Errorf("replay: record %s %q", replay.Record.Status, replay.Record.ErrorCode)
	}
	e.expect(request(s, "other command", "owner-3"), idem.OutcomeConflict)
	e.fenced(d.Lease, "the lease of a replayable failure")
}

// checkFailStatus: Fail takes only the three failure statuses.
func checkFailStatus(e *env) {
	s := e.scope("k")
	d := e.claim(s, "command", "owner-1")
	for _, st := range []idem.Status{idem.StatusInProgress, idem.StatusCompleted, idem.StatusExpired, "FAILED"} {
		if err := e.c.Fail(e.ctx, d.Lease, idem.Failure{Status: st}); idem.ErrorCode(err) != idem.ECodeValidationFailed {
			e.t.Errorf("Fail with status %q: %v, want %s", st, err, idem.ECodeValidationFailed)
		}
	}
	e.same(e.get(s), d.Record, "Get after refused failures")
}

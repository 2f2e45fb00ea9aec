// Package memcoord is an [idem.Coordinator] that keeps its records in
// memory, for the unit tests of services built on idem: give a
// [*Coordinator] to engine.New (or wherever a service takes an
// idem.Coordinator) and a test runs without PostgreSQL or a node.
//
// It keeps the contract of the PostgreSQL store (package store) and passes
// the same contract suite (package coordtest): a free key is claimed by
// one atomic insert and starts at BeginRequest.StartAt; a claim sent again
// under its BeginRequest.ClaimID gets its lease back while its record is
// open (so a test can lose a Begin's answer on purpose); an existing record
// answers as [idem.Decide] says at the coordinator's time; a stale,
// retryable or unknown record is taken over with a higher fencing token
// (the record's own counter, or BeginRequest.FencingToken when the caller
// fences through an external lock); a settled record past its window is
// reused as a new generation; and every Checkpoint, Complete and Fail is
// fenced by its lease's token. Lock times and windows are measured on the
// clock given with [WithClock] (default [time.Now]), so a test makes a
// record stale or expired by moving that clock on. It is safe for
// concurrent use.
//
// It is not for production. Records live in the memory of one process: they
// are gone when it exits (no durability), so a retry after a restart
// executes again, and two processes (two replicas of a service, or a
// service and its recovery worker in another process) each have records of
// their own and both execute the same key. Records are never removed (no
// cleanup of expired ones), so memory grows with every key. There is no
// replication, no home region and no network API; HomeRegion is stored as
// given. Use package store (PostgreSQL or CockroachDB) or a regional node
// (package coordclient) outside tests.
package memcoord

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idemcoord/idem"
)

// Coordinator is an in-memory idem.Coordinator. Create it with New; it is
// safe for concurrent use.
type Coordinator struct {
	now func() time.Time

	mu      sync.Mutex
	records map[idem.Scope]*idem.Record
	// claims holds the BeginRequest.ClaimID of the claim that inserted or
	// last took over each record (the store's claim_id column).
	claims map[idem.Scope]string
}

var _ idem.Coordinator = (*Coordinator)(nil)

// Option configures New.
type Option func(*Coordinator)

// WithClock sets the clock that lock times (BeginRequest.LockFor), windows
// (BeginRequest.Window) and the records' timestamps are read from, in place
// of the store's clock. now must be safe for concurrent use. Default
// time.Now.
func WithClock(now func() time.Time) Option {
	return func(c *Coordinator) { c.now = now }
}

// New returns a Coordinator with no records.
func New(opts ...Option) *Coordinator {
	c := &Coordinator{now: time.Now, records: make(map[idem.Scope]*idem.Record), claims: make(map[idem.Scope]string)}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// clock returns the coordinator's time, without a monotonic reading (as a
// time read back from a store has none, so that == and Equal agree).
func (c *Coordinator) clock() time.Time { return c.now().Round(0) }

// Begin implements idem.Coordinator: it claims a free key, or decides what
// the key's record allows and takes it over when the decision is
// OutcomeRecover or OutcomeExpired, all under one lock, so exactly one of
// many concurrent requests gets the key.
func (c *Coordinator) Begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	if err := req.Validate(); err != nil {
		return idem.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Decision{}, fmt.Errorf("memcoord: begin: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	rec, ok := c.records[req.Scope]
	if !ok {
		// Insert first: the key is free, and this request owns it.
		rec = &idem.Record{
			Scope:       req.Scope,
			RequestHash: req.RequestHashes[0], HashVersion: req.HashVersion,
			Status: idem.StatusInProgress, Checkpoint: req.StartCheckpoint(),
			Owner: req.Owner, FencingToken: 1, LockedUntil: at(now.Add(req.LockFor)),
			Attempts: 1, HomeRegion: req.HomeRegion,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(req.Window),
		}
		c.records[req.Scope] = rec
		c.claims[req.Scope] = req.ClaimID
		return idem.Decision{Outcome: idem.OutcomeExecute, Lease: leaseOf(rec), Record: clone(rec)}, nil
	}
	if outcome, ok := idem.DecideOwnClaim(rec, req.ClaimID, c.claims[req.Scope], req.StartCheckpoint()); ok {
		// The request's own claim, sent again (its caller never heard the
		// answer): its lease back, as the store hands it back.
		return idem.Decision{Outcome: outcome, Lease: leaseOf(rec), Record: clone(rec)}, nil
	}
	outcome := idem.Decide(rec, req.RequestHashes, now)
	switch outcome {
	case idem.OutcomeRecover:
		if req.ExternalFencing && req.FencingToken == 0 {
			// The caller takes the scope's external lock first and
			// calls again with its token.
			return idem.Decision{Outcome: outcome, Record: clone(rec)}, nil
		}
		if req.FencingToken != 0 && req.FencingToken <= rec.FencingToken {
			return idem.Decision{}, fmt.Errorf("memcoord: begin: take over with token %d, record has %d: %w", req.FencingToken, rec.FencingToken, idem.ErrFenced)
		}
		token := rec.FencingToken + 1
		if req.FencingToken > 0 {
			token = req.FencingToken
		}
		// The checkpoint stays: it is how far the previous owner got.
		rec.Status, rec.Owner, rec.FencingToken = idem.StatusInProgress, req.Owner, token
		rec.LockedUntil, rec.Attempts, rec.UpdatedAt = at(now.Add(req.LockFor)), rec.Attempts+1, now
	case idem.OutcomeExpired:
		// A new operation on the same key: a new generation, under a
		// higher token than any the old one granted.
		*rec = idem.Record{
			Scope:       req.Scope,
			RequestHash: req.RequestHashes[0], HashVersion: req.HashVersion,
			Status: idem.StatusInProgress, Checkpoint: idem.CheckpointReceived,
			Owner: req.Owner, FencingToken: rec.FencingToken + 1, LockedUntil: at(now.Add(req.LockFor)),
			Attempts: 1, Generation: rec.Generation + 1, HomeRegion: req.HomeRegion,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(req.Window),
		}
	default:
		return idem.Decision{Outcome: outcome, Record: clone(rec)}, nil
	}
	c.claims[req.Scope] = req.ClaimID
	return idem.Decision{Outcome: outcome, Lease: leaseOf(rec), Record: clone(rec), ExpiredRetry: outcome == idem.OutcomeExpired}, nil
}

// Checkpoint implements idem.Coordinator. The owner's lock is not extended.
func (c *Coordinator) Checkpoint(ctx context.Context, lease idem.Lease, cp idem.Checkpoint) error {
	return c.fenced(ctx, "checkpoint", lease, func(rec *idem.Record) {
		rec.Checkpoint = cp
	})
}

// Complete implements idem.Coordinator. A response with ByReference keeps
// its Status and SchemaVersion but neither Headers nor Body, as the store
// does.
func (c *Coordinator) Complete(ctx context.Context, lease idem.Lease, done idem.Completion) error {
	return c.fenced(ctx, "complete", lease, func(rec *idem.Record) {
		rec.Status, rec.Checkpoint, rec.LockedUntil = idem.StatusCompleted, idem.CheckpointCompleted, nil
		rec.Response = stored(&done.Response)
		rec.ResourceType, rec.ResourceID, rec.ErrorCode = done.ResourceType, done.ResourceID, ""
	})
}

// Fail implements idem.Coordinator. f.Status must be
// StatusFailedReplayable, StatusFailedRetryable or StatusUnknown (else
// REQUEST_VALIDATION_FAILED); the checkpoint stays as the owner left it.
func (c *Coordinator) Fail(ctx context.Context, lease idem.Lease, f idem.Failure) error {
	switch f.Status {
	case idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown:
	default:
		return idem.Errorf(idem.ECodeValidationFailed, "A failure must be FAILED_REPLAYABLE, FAILED_RETRYABLE or UNKNOWN_REQUIRES_RECOVERY.")
	}
	return c.fenced(ctx, "fail", lease, func(rec *idem.Record) {
		rec.Status, rec.LockedUntil, rec.ErrorCode = f.Status, nil, f.ErrorCode
		rec.Response = stored(f.Response)
	})
}

// fenced applies write to lease's record if the record is still open
// (IN_PROGRESS or UNKNOWN_REQUIRES_RECOVERY) under lease's token, and
// fails with idem.ErrFenced otherwise.
func (c *Coordinator) fenced(ctx context.Context, what string, lease idem.Lease, write func(*idem.Record)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memcoord: %s: %w", what, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.records[lease.Scope]
	if !ok || rec.FencingToken != lease.Token || (rec.Status != idem.StatusInProgress && rec.Status != idem.StatusUnknown) {
		return fmt.Errorf("memcoord: %s: %w", what, idem.ErrFenced)
	}
	write(rec)
	rec.UpdatedAt = c.clock()
	return nil
}

// Get implements idem.Coordinator: a copy of scope's record, or an error
// matching idem.ErrRecordNotFound.
func (c *Coordinator) Get(ctx context.Context, scope idem.Scope) (*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memcoord: get: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.records[scope]
	if !ok {
		return nil, fmt.Errorf("memcoord: get: %w", idem.ErrRecordNotFound)
	}
	return clone(rec), nil
}

// ListStale returns copies of up to limit records of operation that nobody
// is working on: IN_PROGRESS past their lock, or UNKNOWN_REQUIRES_RECOVERY
// with no lock held, whatever their age; least recently updated first. It
// makes the Coordinator an engine.StaleLister, so engine.RecoverStale works
// over it.
func (c *Coordinator) ListStale(ctx context.Context, operation string, limit int) ([]*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memcoord: list stale: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	var out []*idem.Record
	for _, rec := range c.records {
		if rec.Operation != operation || (rec.Status != idem.StatusInProgress && rec.Status != idem.StatusUnknown) {
			continue
		}
		if rec.LockedUntil == nil || rec.LockedUntil.Before(now) {
			out = append(out, clone(rec))
		}
	}
	slices.SortFunc(out, func(a, b *idem.Record) int { return a.UpdatedAt.Compare(b.UpdatedAt) })
	if len(out) > max(limit, 0) {
		out = out[:max(limit, 0)]
	}
	return out, nil
}

func at(t time.Time) *time.Time { return &t }

func leaseOf(r *idem.Record) idem.Lease {
	return idem.Lease{Scope: r.Scope, Token: r.FencingToken, Owner: r.Owner}
}

// stored is what a record keeps of r: a copy, without headers and body
// for a response by reference, with nil for no headers (as the store reads
// them back).
func stored(r *idem.Response) *idem.Response {
	if r == nil {
		return nil
	}
	s := &idem.Response{Status: r.Status, SchemaVersion: r.SchemaVersion, ByReference: r.ByReference}
	if !r.ByReference {
		s.Body = bytes.Clone(r.Body)
		if len(r.Headers) > 0 {
			s.Headers = maps.Clone(r.Headers)
		}
	}
	return s
}

// clone returns a deep copy of rec, so that a caller's changes never reach
// the stored record.
func clone(rec *idem.Record) *idem.Record {
	c := *rec
	if rec.LockedUntil != nil {
		c.LockedUntil = at(*rec.LockedUntil)
	}
	if rec.Response != nil {
		r := *rec.Response
		r.Body, r.Headers = bytes.Clone(r.Body), maps.Clone(r.Headers)
		c.Response = &r
	}
	return &c
}

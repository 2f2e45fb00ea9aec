package engine

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine/answers"
)

// AnswerCache configures the engine's cache of settled answers
// (Options.AnswerCache): a record that is COMPLETED or FAILED_REPLAYABLE
// never changes until its window ends, so the engine may keep its answer
// in memory and replay a retry (or refuse a reused key) with no store
// round trip. What it keeps is exact:
//
//   - an answer is kept only from a commit the node saw acknowledged (a
//     completion or replayable failure whose first commit was answered,
//     through AcknowledgedWriter, or a result an operation stored in its
//     own transaction, Result.Stored and Claim.Done, whose commit returned)
//     or from a durable read (a replay the Coordinator or a ClaimFunc
//     decided on a settled record): never from a commit whose answer was
//     lost and which the store confirmed by reading the record back;
//   - it lives no longer than its record's window, nor than Retention
//     after the record's creation: the record's expires_at minus the
//     store's time, measured from before the store's time was read on the
//     engine's Clock (the monotonic clock), less 0.1% for the two clocks'
//     rates (never by comparing the clocks);
//   - it carries the record's request hash, so a reused key with another
//     command is refused from memory as the store would refuse it, and a
//     raw hash (Request.RawHash), so a retry with the same bytes is
//     replayed without its command being parsed;
//   - it is kept by the full scope (tenant, operation, key) and the
//     record's generation.
//
// An answer the engine reads is kept only over a Coordinator that is a
// StoreClock, and one it writes through Complete or Fail only over an
// AcknowledgedWriter: *store.Store is both, memcoord and coordclient
// neither (a node's coordination API keeps its own, see Engine.Begin).
type AnswerCache struct {
	// Bytes bounds the memory the kept answers hold (their bodies,
	// headers, hashes and a fixed cost per entry); the least recently
	// used leave first. 0 (the default) turns the cache off.
	Bytes int64
	// Retention bounds how long after its record's creation an answer
	// stays in memory, as the store's body retention bounds how long it
	// stays stored. 0: until the record's window ends, never longer.
	Retention time.Duration
	// Metrics counts hits, misses and evictions, and the entries and
	// bytes held; idemprom.NewAnswerCache implements it with Prometheus
	// metrics registered on a prometheus.Registerer. Default: not counted.
	Metrics answers.Metrics
}

// AcknowledgedWriter is a Coordinator that tells a write acknowledged by
// its own commit from one it confirmed only by reading the record back
// after the commit's answer was lost (which a store primary cut off from
// its synchronous standbys can show and then lose); *store.Store satisfies
// it. The answer cache keeps only what the former wrote.
type AcknowledgedWriter interface {
	CompleteAcknowledged(ctx context.Context, lease idem.Lease, c idem.Completion) (acknowledged bool, err error)
	FailAcknowledged(ctx context.Context, lease idem.Lease, f idem.Failure) (acknowledged bool, err error)
}

// StoreClock is a Coordinator that reads the clock its record times come
// from; *store.Store satisfies it. The answer cache measures how long it
// may keep an answer it read from the record's expiry and this clock.
type StoreClock interface {
	Now(ctx context.Context) (time.Time, error)
}

// storeTimeMaxAge is how long a reading of the store's clock measures the
// windows of answers the engine reads. A reading stays exact for as long
// as the two clocks run at the same rate; a newer one is taken to follow a
// store that failed over to a server whose clock is set differently.
const storeTimeMaxAge = 10 * time.Second

// driftShare is the share of a kept answer's life cut off for the rates of
// the engine's clock and the store's: 1/1000 (1,000 ppm, ten times what
// a quartz clock without NTP drifts).
const driftShare = 1000

// answerCache is the engine's side of the cache: what it keeps and until
// when (answers.Cache keeps what it is given).
type answerCache struct {
	cache     *answers.Cache
	retention time.Duration
	now       func() time.Time
	// clock reads the store's time (nil: answers read are not kept);
	// acks writes that say whether their commit was acknowledged (nil:
	// answers written through the Coordinator are not kept).
	clock StoreClock
	acks  AcknowledgedWriter

	mu sync.Mutex
	at storeTime
}

// storeTime is a reading of the store's clock and the engine's clock
// before it was asked for: the store's time at any instant is then at
// most store + (engine's time then - local).
type storeTime struct {
	store, local time.Time
}

// until is the engine's time at which the store's time has surely not
// reached limit yet (less the drift share): the end of a kept answer.
func (t storeTime) until(limit time.Time) time.Time {
	return t.local.Add(shrink(limit.Sub(t.store)))
}

func shrink(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d - d/driftShare
}

func newAnswerCache(coord idem.Coordinator, opts AnswerCache, now func() time.Time) *answerCache {
	cache := answers.New(answers.Options{MaxBytes: opts.Bytes, Now: now, Metrics: opts.Metrics})
	if cache == nil {
		return nil
	}
	c := &answerCache{cache: cache, retention: max(opts.Retention, 0), now: now}
	c.clock, _ = coord.(StoreClock)
	c.acks, _ = coord.(AcknowledgedWriter)
	return c
}

// limit is the store's time after which rec's answer may not be kept:
// its window's end, or Retention after its creation if that comes first.
func (c *answerCache) limit(rec *idem.Record) time.Time {
	limit := rec.ExpiresAt
	if c.retention > 0 && !rec.CreatedAt.IsZero() {
		limit = minTime(limit, rec.CreatedAt.Add(c.retention))
	}
	return limit
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// claimed takes the store's time from a record the Coordinator's own
// Begin claimed (inserted or took over) for this request: its updated_at
// is the claim's now(), read after start.
func (c *answerCache) claimed(start time.Time, d idem.Decision) {
	if c == nil || c.clock == nil || d.Lease.Token == 0 || d.Record == nil || d.Record.UpdatedAt.IsZero() {
		return
	}
	c.observe(storeTime{store: d.Record.UpdatedAt, local: start})
}

func (c *answerCache) observe(t storeTime) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.local.IsZero() || t.local.After(c.at.local) {
		c.at = t
	}
}

// storeTime returns a recent reading of the store's clock, read now if
// there is none.
func (c *answerCache) storeTime(ctx context.Context) (storeTime, bool) {
	now := c.now()
	c.mu.Lock()
	at := c.at
	c.mu.Unlock()
	if !at.local.IsZero() && now.Sub(at.local) < storeTimeMaxAge {
		return at, true
	}
	if c.clock == nil {
		return storeTime{}, false
	}
	s, err := c.clock.Now(ctx)
	if err != nil {
		return storeTime{}, false
	}
	at = storeTime{store: s, local: now}
	c.observe(at)
	return at, true
}

// lookup returns the answer kept for scope: Do replays it to the same
// command and refuses it to another (fingerprints.sameCommand).
func (c *answerCache) lookup(scope idem.Scope) (answers.Entry, bool) {
	if c == nil {
		return answers.Entry{}, false
	}
	return c.cache.Get(answers.KindAnswer, scope)
}

// keepRead keeps resp, the answer a replay of rec returned to begin's
// request: the Coordinator or the claim decided it on a settled record it
// read durably.
func (c *answerCache) keepRead(ctx context.Context, begin idem.BeginRequest, rec *idem.Record, resp idem.Response) {
	if c == nil || !replayable(rec.Status) {
		return
	}
	at, ok := c.storeTime(ctx)
	if !ok {
		return
	}
	c.cache.Put(answers.KindAnswer, begin.Scope, answers.Entry{RequestHash: rec.RequestHash, RawHash: keptRawHash(rec, begin),
		Generation: rec.Generation, Status: rec.Status, Response: replayResponse(resp), Until: at.until(c.limit(rec))})
}

// keepWritten keeps the answer of a request that settled the record, if
// its commit was acknowledged. start is the engine's time before the
// claim, d the claim's decision.
func (c *answerCache) keepWritten(ctx context.Context, begin idem.BeginRequest, d idem.Decision, start time.Time, ans Answer, err error) {
	if c == nil || err != nil || !ans.acknowledged || !replayable(ans.Status) {
		return
	}
	e := answers.Entry{RequestHash: begin.RequestHashes[0], RawHash: keptRawHash(d.Record, begin), Status: ans.Status, Response: replayResponse(ans.Response)}
	switch rec := d.Record; {
	case rec == nil && d.Outcome == idem.OutcomeExecute:
		// A claim's insert of a free key, not read back: its window,
		// begin.Window, starts at the insert's now(), after start.
		limit := begin.Window
		if c.retention > 0 {
			limit = min(limit, c.retention)
		}
		e.Until = start.Add(shrink(limit))
	case rec != nil && !rec.ExpiresAt.IsZero():
		if d.Outcome == idem.OutcomeRecover {
			// A takeover keeps the record's command (an insert and an
			// expired key's takeover store the request's first hash).
			e.RequestHash = rec.RequestHash
		}
		at, ok := c.storeTime(ctx)
		if !ok {
			return
		}
		e.Generation, e.Until = rec.Generation, at.until(c.limit(rec))
	default:
		return
	}
	c.cache.Put(answers.KindAnswer, begin.Scope, e)
}

// complete and fail write through the Coordinator and report whether the
// write's own commit was acknowledged (never, over a Coordinator that
// cannot tell, or with the cache off).
func (e *Engine) complete(ctx context.Context, lease idem.Lease, c idem.Completion) (bool, error) {
	if e.answers != nil && e.answers.acks != nil {
		return e.answers.acks.CompleteAcknowledged(ctx, lease, c)
	}
	return false, e.coord.Complete(ctx, lease, c)
}

func (e *Engine) fail(ctx context.Context, lease idem.Lease, f idem.Failure) (bool, error) {
	if e.answers != nil && e.answers.acks != nil {
		return e.answers.acks.FailAcknowledged(ctx, lease, f)
	}
	return false, e.coord.Fail(ctx, lease, f)
}

// replayable reports whether a record in st answers retries with its
// stored answer (idem.Decide's replay).
func replayable(st idem.Status) bool {
	return st == idem.StatusCompleted || st == idem.StatusFailedReplayable
}

// replayResponse is resp as a replay of the record that stores it returns:
// no referencing marker (the answer is rendered), no empty header map.
func replayResponse(resp idem.Response) idem.Response {
	resp.ByReference = false
	if len(resp.Headers) == 0 {
		resp.Headers = nil
	}
	return resp
}

// Answers returns the engine's answer cache (nil when it is off), for its
// size and for tests.
func (e *Engine) Answers() *answers.Cache {
	if e.answers == nil {
		return nil
	}
	return e.answers.cache
}

// Coordinator returns the Coordinator the engine runs over.
func (e *Engine) Coordinator() idem.Coordinator { return e.coord }

// Begin is the engine's Coordinator's Begin, for a caller that serves the
// Coordinator contract itself (a node's coordination API): a request the
// answer cache can decide (a live record kept from a replay the
// Coordinator decided) is answered from memory as the Coordinator would
// answer it, a replay or a refusal with the record as it was read; every
// other request goes to the Coordinator, and a replay it decides is kept.
// These records are kept apart from Do's answers (answers.KindRecord):
// they are the record as stored, not an operation's rendered answer.
// Without the cache it is the Coordinator's Begin.
func (e *Engine) Begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	c := e.answers
	if c == nil {
		return e.coord.Begin(ctx, req)
	}
	if err := req.Validate(); err != nil {
		return idem.Decision{}, err
	}
	if kept, ok := c.cache.Get(answers.KindRecord, req.Scope); ok && kept.Record != nil {
		rec := *kept.Record
		outcome := idem.OutcomeReplay
		if !slices.Contains(req.RequestHashes, rec.RequestHash) {
			outcome = idem.OutcomeConflict
		}
		return idem.Decision{Outcome: outcome, Record: &rec}, nil
	}
	start := c.now()
	d, err := e.coord.Begin(ctx, req)
	if err != nil {
		return d, err
	}
	c.claimed(start, d)
	if rec := d.Record; d.Outcome == idem.OutcomeReplay && rec != nil && rec.Response != nil && replayable(rec.Status) {
		if at, ok := c.storeTime(ctx); ok {
			c.cache.Put(answers.KindRecord, req.Scope, answers.Entry{RequestHash: rec.RequestHash, Generation: rec.Generation,
				Status: rec.Status, Record: rec, Until: at.until(c.limit(rec))})
		}
	}
	return d, nil
}

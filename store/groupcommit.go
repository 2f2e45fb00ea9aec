package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemcoord/idem"
)

// maxGroup bounds how many writes one statement carries.
const maxGroup = 32

// group is a group commit: the writes of one kind (claims, checkpoints,
// completions) of concurrent requests that queue while batches are in
// flight go to the store together, in one statement that is one implicit
// transaction, so that N requests pay one statement and one commit
// instead of N. A write that finds no batch in flight goes at once; one
// that finds batches in flight waits for them, unless fewer than inFlight
// are and at least extraAt writes wait, when it starts another batch. A
// batch is what queued while the batches before it were in flight. How
// many batches may be in flight, and when another starts beside them, are
// the group's (writesInFlight; claimsInFlight, claimsExtraAt). The
// callers run the batches (no goroutine of their own): a caller is handed
// the lead when a batch may start, runs one batch of the queue's head (its
// own write or others'), and hands the lead on when its batch is done. A
// batch never holds two writes of one scope.
type group[In, Out any] struct {
	mu    sync.Mutex
	queue []*groupItem[In, Out]
	// running is how many leads are out (batches in flight or about to
	// start), at most limit(): inFlight, how many batches may be in flight
	// while the group batches, or any number while adapt has it send every
	// write alone.
	running, inFlight int
	// extraAt is how many writes must wait (the queued ones included)
	// before a batch starts beside one in flight while the group batches;
	// 0 or 1: at once. A finished batch hands its lead on to the first
	// write waiting whatever their number (handOn).
	extraAt int
	// adapt, when set, chooses between batching and sending every write
	// alone by measuring both (see adaptive). A group without it batches.
	adapt *adaptive
	// holding freezes the regime while a test holds the group (hold).
	holding bool
	// scope is the scope an input writes.
	scope func(In) idem.Scope
	// write writes a batch and sets each item's out and err.
	write func(ctx context.Context, batch []*groupItem[In, Out])
	// stats counts the batches written (nil: not counted).
	stats *groupCounters
}

// anyInFlight is limit() while every write goes alone: more than the
// concurrency of any caller (which the store's pool bounds anyway).
const anyInFlight = 1 << 20

// limit is how many leads may be out. The group's lock is held.
func (g *group[In, Out]) limit() int {
	if g.adapt != nil && g.adapt.alone {
		return anyInFlight
	}
	return g.inFlight
}

// writesInFlight is how many batches of Begin's claims, of checkpoints
// and of completions may be in flight at once. Their requests spend most
// of their time between those writes (an upstream's answer, an
// operation's Execute), so their writes reach the group spread out: with a
// second batch allowed in flight, half of them went alone, each a
// transaction of its own (a sidecar at concurrency 32: 7,700 of 8,965
// completions in 1,116 batches); with one, 9,300 of 9,750 in 1,046, and
// the sidecar served 9% more (docs/benchmarks.md, "Generic batch plans
// and one batch in flight").
const writesInFlight = 1

// claimsInFlight is how many batches of a ClaimOrReadGroup may be in
// flight at once while it batches (it measures whether batching pays, see
// adaptive). Its claim is most of its request (a payment without a
// provider is claimed, written and completed by it), so one batch at a
// time would leave the store idle while the batch's answer travels back
// and the next batch's requests are prepared: the store suite at
// concurrency 8 measured a tenth less with one. But a second batch
// started for the first claim to find one in flight was most often a
// claim alone (6,681 of 15,000 batches at concurrency 8), a transaction
// and a commit of its own for one claim: claimsExtraAt holds it back until
// four claims wait, which took the store suite at concurrency 8 from 0.67
// to 0.73 of the baseline write on a machine with a cheap flush, and from
// 0.77 to 0.89 on one with a dear flush (docs/benchmarks.md, "Issue 34's
// targets and what was tried" and "A second batch once three claims
// wait"). A claim that finds no batch in flight still goes at once.
const (
	claimsInFlight = 2
	claimsExtraAt  = 4
)

// groupItem is one caller's write in a group's queue.
type groupItem[In, Out any] struct {
	in  In
	out Out
	err error
	// done is closed when out and err are set; lead when this caller is
	// to run a batch (led, under the group's lock, says it was).
	done chan struct{}
	lead chan struct{}
	led  bool
	// taken says a batch took the write (under the group's lock).
	taken bool
	// epoch is the adaptive regime's epoch when the write queued.
	epoch uint64
}

// do queues in, runs a batch when it is handed the lead, and returns its
// outcome.
func (g *group[In, Out]) do(ctx context.Context, in In) (Out, error) {
	it := &groupItem[In, Out]{in: in, done: make(chan struct{}), lead: make(chan struct{})}
	var start time.Time
	g.mu.Lock()
	if g.adapt != nil {
		start = time.Now()
		it.epoch = g.adapt.epoch
	}
	g.queue = append(g.queue, it)
	if g.mayStart() {
		g.running++
		g.handLead(it)
	}
	g.mu.Unlock()
	select {
	case <-it.lead:
		g.lead(ctx, it)
		<-it.done
	case <-it.done:
		// Another caller's batch took this write. A lead handed to this
		// caller meanwhile is still a batch to run, for the writes queued
		// after it.
		g.mu.Lock()
		led := it.led
		g.mu.Unlock()
		if led {
			g.lead(ctx, nil)
		}
	}
	if g.adapt != nil {
		g.mu.Lock()
		if !g.holding && g.adapt.observe(it.epoch, time.Since(start)) {
			g.fill()
		}
		g.mu.Unlock()
	}
	return it.out, it.err
}

// mayStart reports whether a write just queued starts a batch: while the
// regime allows another lead out, at once when no batch is in flight, and
// beside batches in flight only once extraAt writes wait (the queued ones
// included). The group's lock is held.
func (g *group[In, Out]) mayStart() bool {
	switch {
	case g.running >= g.limit():
		return false
	case g.running == 0 || g.adapt != nil && g.adapt.alone:
		return true
	}
	return len(g.queue) >= g.extraAt
}

// handLead hands it the lead. The group's lock is held.
func (g *group[In, Out]) handLead(it *groupItem[In, Out]) {
	it.led = true
	close(it.lead)
}

// lead runs batches with a lead until own (the caller's write, nil for
// none) is taken, and hands the lead on. A batch holds one write of a
// scope, so it may leave own queued behind an earlier write of its scope;
// the lead is own's caller's to spend until own is written, or own could
// wait in the queue with a lead already spent, for good.
func (g *group[In, Out]) lead(ctx context.Context, own *groupItem[In, Out]) {
	for {
		g.runBatch(ctx)
		g.mu.Lock()
		if own != nil && !own.taken {
			g.mu.Unlock()
			continue
		}
		g.handOn()
		g.mu.Unlock()
		return
	}
}

// runBatch takes the head of the queue (at most maxGroup writes, no two of
// one scope), writes it and delivers each outcome.
func (g *group[In, Out]) runBatch(ctx context.Context) {
	g.mu.Lock()
	var batch, rest []*groupItem[In, Out]
	seen := map[idem.Scope]bool{}
	for _, it := range g.queue {
		if sc := g.scope(it.in); len(batch) < maxGroup && !seen[sc] {
			seen[sc] = true
			it.taken = true
			batch = append(batch, it)
			continue
		}
		rest = append(rest, it)
	}
	g.queue = rest
	g.mu.Unlock()

	if len(batch) > 0 {
		g.stats.count(len(batch))
		g.write(ctx, batch)
		for _, it := range batch {
			close(it.done)
		}
	}
}

// handOn passes a finished lead to the first queued caller without one, or
// gives it up: when no caller waits for one, or when more leads are out
// than the regime allows (the group has just turned from sending writes
// alone to batching). The group's lock is held.
func (g *group[In, Out]) handOn() {
	if g.running <= g.limit() {
		for _, it := range g.queue {
			if !it.led {
				g.handLead(it)
				return
			}
		}
	}
	g.running--
}

// fill hands leads to queued callers without one while the regime allows
// more leads out: the group has just turned from batching to sending
// writes alone. The group's lock is held.
func (g *group[In, Out]) fill() {
	for _, it := range g.queue {
		if g.running >= g.limit() {
			return
		}
		if !it.led {
			g.running++
			g.handLead(it)
		}
	}
}

// queued reports how many writes wait (for tests).
func (g *group[In, Out]) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// hold makes the group queue as if every batch were in flight, until
// release runs the queued writes as one batch (for tests).
func (g *group[In, Out]) hold() (release func()) {
	g.mu.Lock()
	g.holding = true
	held := g.limit() - g.running
	g.running = g.limit()
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.holding = false
		// One lead for the queue: the rest given up.
		g.running -= held
		if g.running < g.limit() {
			g.running++
			g.handOn()
		}
	}
}

// --- completions ---

// completionIn is one completion of a batch.
type completionIn struct {
	lease idem.Lease
	cols  storedResponse
	c     idem.Completion
}

// newFencedGroup is the group commit of one kind of owner's write (a
// completion, a checkpoint): a batch is one UPDATE ... FROM unnest(...)
// (unnestRows), sql, whose rows are the writes' args of types, each row
// fenced by its own lease as fencedExec fences one, that returns the
// scopes it wrote. Each write's outcome is nil (written), idem.ErrFenced
// (its lease no longer owns an open record), or the batch's error, which
// may be ErrCommitUnknown (the caller resolves that record by record, see
// fencedWriteFirst). A batch of one write is that write's own statement,
// one (fencedExec's), whose plan is simpler.
func newFencedGroup[In any](s *Store, lease func(In) idem.Lease, sql string, types []string, args func(In) []any,
	one func(ctx context.Context, q Querier, in In) error) *group[In, struct{}] {
	return &group[In, struct{}]{
		inFlight: writesInFlight,
		scope:    func(in In) idem.Scope { return lease(in).Scope },
		write: func(ctx context.Context, batch []*groupItem[In, struct{}]) {
			if len(batch) == 1 {
				it := batch[0]
				it.err = s.ExecOne(ctx, func(q Querier) error { return one(ctx, q, it.in) })
				return
			}
			rows := make([][]any, len(batch))
			for i, it := range batch {
				rows[i] = args(it.in)
			}
			cols, err := columnArrays(types, rows)
			var written map[idem.Scope]bool
			if err == nil {
				written, err = s.fencedBatch(ctx, sql, cols)
			}
			for _, it := range batch {
				switch {
				case err != nil:
					it.err = err
				case !written[lease(it.in).Scope]:
					it.err = idem.ErrFenced
				}
			}
		},
	}
}

// fencedBatch runs a batch statement of newFencedGroup and reports which
// scopes it wrote.
func (s *Store) fencedBatch(ctx context.Context, sql string, args []any) (map[idem.Scope]bool, error) {
	var written map[idem.Scope]bool
	err := s.execBatch(ctx, func(q Querier) error {
		written = map[idem.Scope]bool{}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sc idem.Scope
			if err := rows.Scan(&sc.Tenant, &sc.Operation, &sc.Key); err != nil {
				return err
			}
			written[sc] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return written, nil
}

// newCompletions is the group commit of Complete (newFencedGroup).
func (s *Store) newCompletions() *group[completionIn, struct{}] {
	return newFencedGroup(s, func(in completionIn) idem.Lease { return in.lease }, completeBatchSQL, completeBatchTypes,
		func(p completionIn) []any {
			return []any{p.lease.Tenant, p.lease.Operation, p.lease.Key, p.lease.Token,
				p.cols.status, p.cols.headers, p.cols.body, p.cols.schema, p.cols.byReference,
				nullable(p.c.ResourceType), nullable(p.c.ResourceID)}
		},
		func(ctx context.Context, q Querier, p completionIn) error { return CompleteTx(ctx, q, p.lease, p.c) })
}

// completeInGroup writes c under lease as part of a batch.
func (s *Store) completeInGroup(ctx context.Context, lease idem.Lease, c idem.Completion) error {
	cols, err := responseColumns(&c.Response)
	if err != nil {
		return err
	}
	_, err = s.completions.do(ctx, completionIn{lease: lease, cols: cols, c: c})
	return err
}

// completeBatchTypes are the types of a completion's row of
// completeBatchSQL.
var completeBatchTypes = []string{"TEXT", "TEXT", "TEXT", "INT8", "INT4", "JSONB", "BYTEA", "TEXT", "BOOL", "TEXT", "TEXT"}

// completeBatchSQL is CompleteTx's fenced update for a batch of records.
var completeBatchSQL = `UPDATE idempotency_records AS r SET updated_at = now(), status = 'COMPLETED', checkpoint = 'COMPLETED', locked_until = NULL,
		response_status = v.rs, response_headers = v.rh, response_body = v.rb, response_schema_version = v.sv,
		response_by_reference = v.br, resource_type = v.rt, resource_id = v.ri, error_code = NULL
	FROM ` + unnestRows("v", 1, completeBatchTypes, []string{"t", "o", "k", "tok", "rs", "rh", "rb", "sv", "br", "rt", "ri"}) + `
	WHERE r.tenant_id = v.t AND r.operation_name = v.o AND r.idempotency_key = v.k AND r.fencing_token = v.tok
		AND (r.status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')) IS TRUE
	RETURNING r.tenant_id, r.operation_name, r.idempotency_key`

// --- checkpoints ---

// checkpointIn is one checkpoint of a batch.
type checkpointIn struct {
	lease idem.Lease
	cp    idem.Checkpoint
}

// newCheckpoints is the group commit of Checkpoint (newFencedGroup).
func (s *Store) newCheckpoints() *group[checkpointIn, struct{}] {
	return newFencedGroup(s, func(in checkpointIn) idem.Lease { return in.lease }, checkpointBatchSQL, checkpointBatchTypes,
		func(p checkpointIn) []any {
			return []any{p.lease.Tenant, p.lease.Operation, p.lease.Key, p.lease.Token, string(p.cp)}
		},
		func(ctx context.Context, q Querier, p checkpointIn) error {
			return CheckpointTx(ctx, q, p.lease, p.cp, 0)
		})
}

// checkpointBatchTypes are the types of a checkpoint's row of
// checkpointBatchSQL.
var checkpointBatchTypes = []string{"TEXT", "TEXT", "TEXT", "INT8", "TEXT"}

// checkpointBatchSQL is CheckpointTx's fenced update (lockFor 0) for a
// batch of records.
var checkpointBatchSQL = `UPDATE idempotency_records AS r SET updated_at = now(), checkpoint = v.cp
	FROM ` + unnestRows("v", 1, checkpointBatchTypes, []string{"t", "o", "k", "tok", "cp"}) + `
	WHERE r.tenant_id = v.t AND r.operation_name = v.o AND r.idempotency_key = v.k AND r.fencing_token = v.tok
		AND (r.status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')) IS TRUE
	RETURNING r.tenant_id, r.operation_name, r.idempotency_key`

// --- claims ---

// claimIn is one claim of a batch: the request and its claim id.
type claimIn struct {
	req   idem.BeginRequest
	claim string
}

// claimOut is a claim's outcome, as claimOrRead's: the decision, and
// whether it is final (done false: the caller decides in a transaction).
type claimOut struct {
	d    idem.Decision
	done bool
}

// errClaimAlone is a batch's outcome for a claim that is to be sent in a
// statement of its own: the batch failed with an error that is not an
// unknown commit (a value one request sent that the store refused, say),
// and no request is to fail for another's.
var errClaimAlone = errors.New("store: claim to be sent alone")

// claimsFailed gives each claim of a batch the batch's failure: a lost
// commit (ErrCommitUnknown: the batch may have committed) is each one's
// to resolve as after its own statement; any other failure wrote nothing,
// and each claim is sent again alone (errClaimAlone).
func claimsFailed[In, Out any](batch []*groupItem[In, Out], err error) {
	for _, it := range batch {
		switch {
		case err == nil:
		case errors.Is(err, ErrCommitUnknown):
			it.err = err
		default:
			it.err = errClaimAlone
		}
	}
}

// newClaims is the group commit of the claims of Begin: the claims of
// concurrent requests go in one statement (claimBatchSQL) that inserts
// the free keys and reads the records that hold the others, each
// decided as claimOrRead decides it alone. A claim with nothing in
// flight is claimOrRead's own statement.
func (s *Store) newClaims() *group[claimIn, claimOut] {
	return &group[claimIn, claimOut]{
		inFlight: writesInFlight,
		scope:    func(in claimIn) idem.Scope { return in.req.Scope },
		write: func(ctx context.Context, batch []*groupItem[claimIn, claimOut]) {
			if len(batch) == 1 {
				// One claim is claimOrRead's own statement, under the
				// context of the caller that runs the batch.
				it := batch[0]
				it.err = s.ExecOne(ctx, func(q Querier) (err error) {
					it.out.d, it.out.done, err = s.claimOrRead(ctx, q, it.in.req, it.in.claim)
					return err
				})
				return
			}
			// On a lost commit each resolves its own claim by its claim id
			// (Begin).
			claimsFailed(batch, s.claimBatch(ctx, batch))
		},
	}
}

// claimBatch sends batch's claims in one statement and sets each one's
// outcome; a claim whose key is held by a record the statement cannot see
// is left not done.
func (s *Store) claimBatch(ctx context.Context, batch []*groupItem[claimIn, claimOut]) error {
	rows := make([][]any, len(batch))
	byScope := make(map[idem.Scope]*groupItem[claimIn, claimOut], len(batch))
	for i, it := range batch {
		r := it.in.req
		byScope[r.Scope] = it
		rows[i] = []any{r.Tenant, r.Operation, r.Key, r.RequestHashes[0], r.HashVersion,
			r.Owner, r.LockFor.Milliseconds(), r.HomeRegion, r.Window.Milliseconds(), nullable(it.in.claim), string(r.StartCheckpoint()),
			nullable(r.RawHash)}
	}
	args, err := columnArrays(claimBatchTypes, rows)
	if err != nil {
		return err
	}
	return s.execBatch(ctx, func(q Querier) error {
		for _, it := range batch {
			it.out = claimOut{}
		}
		rows, err := q.Query(ctx, claimBatchSQL, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				now      time.Time
				inserted bool
			)
			rec, err := scanRecord(rows, &now, &inserted)
			if err != nil {
				return err
			}
			it := byScope[rec.Scope]
			if it == nil {
				return fmt.Errorf("claim batch: a row for a scope not in the batch")
			}
			if inserted {
				it.out = claimOut{d: idem.Decision{Outcome: idem.OutcomeExecute, Lease: leaseOf(rec), Record: rec}, done: true}
				continue
			}
			it.out.d, it.out.done, _ = settledDecision(rec, nil, it.in.req, now)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows.Close()
		for _, it := range batch {
			if it.out.done && answered(it.out.d) {
				// One for the batch: it covers every record it read.
				return durable(ctx, q)
			}
		}
		return nil
	})
}

// claimBatchTypes are the types of a claim's row of claimBatchSQL.
var claimBatchTypes = []string{"TEXT", "TEXT", "TEXT", "TEXT", "INT4", "TEXT", "INT8", "TEXT", "INT8", "TEXT", "TEXT", "TEXT"}

// claimBatchSQL is claimOrReadSQL for a batch of keys: it inserts the
// free keys and reads, as of the statement's snapshot, the records that
// hold the others; the last column says which. It inserts
// the keys sorted, so keys go in one order in every batch of every node,
// and two batches that wait on each other's keys cannot wait in a cycle.
var claimBatchSQL = `WITH v AS (SELECT * FROM ` + unnestRows("v", 1, claimBatchTypes,
	[]string{"v_t", "v_o", "v_k", "v_h", "v_hv", "v_ow", "v_lf", "v_hr", "v_w", "v_cl", "v_cp", "v_rh"}) + `),
	ins AS (INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
		 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at, claim_id, raw_hash)
		SELECT v_t, v_o, v_k, v_h, v_hv, 'IN_PROGRESS', v_cp, v_ow, 1,
		 now() + v_lf * INTERVAL '1 millisecond', v_hr, now(), now(), now() + v_w * INTERVAL '1 millisecond', v_cl, v_rh
		FROM v ORDER BY v_t, v_o, v_k
		ON CONFLICT DO NOTHING
		RETURNING ` + recordColumns + `)
	SELECT ` + recordColumns + `, now(), true FROM ins
	UNION ALL
	SELECT ` + recordColumns + `, now(), false FROM idempotency_records
		JOIN v ON tenant_id = v_t AND operation_name = v_o AND idempotency_key = v_k
		WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.tenant_id = v_t AND ins.operation_name = v_o AND ins.idempotency_key = v_k)`

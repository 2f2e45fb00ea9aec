package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
)

// ClaimOrReadGroup is the group commit of a ClaimOrReadWith: the claims of
// concurrent requests that queue while batches are in flight go to the
// store together, in one statement and one commit, as Begin's claims do
// (see group). Each claim's outcome is the one its own statement would
// have had. A claim with nothing in flight is the ClaimOrReadWith's own
// statement, and so is each claim of a batch the store refused as a
// whole (a unique violation of the operation's table, a serialization
// failure, a deadlock): nothing of such a batch was written, so every
// claim in it is sent again alone, where the violation fails its own
// request only. The group measures whether batching pays on its machine
// and, where claims alone wait less (a cheap flush), sends every claim
// alone (adaptive). Make one per store and operation with
// Store.NewClaimOrReadGroup.
type ClaimOrReadGroup struct {
	s      *Store
	single ClaimOrReadWith
	sql    string
	types  []string
	g      *group[groupClaimIn, ClaimOrRead]
}

// groupClaimIn is one claim of a ClaimOrReadGroup's batch: its request,
// its arguments (claimArgs' order) and where its record's row is scanned.
type groupClaimIn struct {
	req  idem.BeginRequest
	args []any
	dest []any
	// alone sends the claim in a statement of its own.
	alone func(ctx context.Context) (ClaimOrRead, error)
}

// NewClaimOrReadGroup makes the group commit of single, whose batch form
// is own and row:
//
//   - own follows the record's insert as single's own follows it, but
//     reads FROM claimed instead of FROM claim: claimed has one row per
//     key the batch inserted, whose columns a1 to aN are that claim's
//     arguments (single's $1 to $N), of the SQL types types names in
//     order: TEXT, JSONB, INT4, INT8, BOOL or BYTEA (a batch sends each
//     column as an array; NewClaimOrReadGroup panics on another). Its last
//     common table expression is named written and returns one row per
//     claimed key.
//   - row is the query of the operation's table as NewReferenceRead
//     takes it, keyed on the record's tenant (r.tenant_id) instead of $1.
//
// columns are row's columns, as single's.
func (s *Store) NewClaimOrReadGroup(single ClaimOrReadWith, own string, types []string, resourceType, row string, columns ...string) *ClaimOrReadGroup {
	if len(types) != single.nArgs {
		panic(fmt.Sprintf("store: claim group: %d argument types, the statement takes %d", len(types), single.nArgs))
	}
	all := append(append([]string{"INT4"}, recordArgTypes...), types...)
	if err := checkBatchTypes(all); err != nil {
		panic(err)
	}
	g := &ClaimOrReadGroup{s: s, single: single, types: all,
		sql: claimOrReadBatchSQL(own, all, resourceType, row, columns)}
	if s.claims != nil {
		// The store groups its writes (Options.NoGroupCommit not set).
		g.g = &group[groupClaimIn, ClaimOrRead]{
			inFlight: claimsInFlight,
			extraAt:  claimsExtraAt,
			adapt:    newAdaptive(),
			scope:    func(in groupClaimIn) idem.Scope { return in.req.Scope },
			write:    g.write,
			stats:    s.groupCounters(GroupOperationClaims),
		}
	}
	return g
}

// Exec is single.Exec in a statement of its own (Store.ExecOne), or in a
// batch with the claims of concurrent requests when batches are in
// flight: see ClaimOrReadWith.Exec for what it reports.
func (g *ClaimOrReadGroup) Exec(ctx context.Context, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args []any, dest ...any) (ClaimOrRead, error) {
	return g.exec(ctx, true, req, status, cp, completion, resourceType, resourceID, args, dest)
}

// ExecExpectFree is Exec for a claim whose key is most likely free, as
// while a caller sees few retries: a claim that goes alone (not in a
// batch) is single's claim and writes without the read. An unexecuted
// read still costs a fresh key at every execution: PostgreSQL starts the
// read's plan and describes its row (the record's and the operation's
// columns) whether or not the key was free, about a fifth of the claim's
// time on the server (docs/benchmarks.md, "A plain claim while retries are
// rare"). A key found taken then reports neither Inserted nor Settled, and
// the caller decides in a transaction (DecideExisting), as for a record
// that is not settled. A claim that joins a batch is read as with Exec:
// there the read is the batch's, once for all of its claims.
func (g *ClaimOrReadGroup) ExecExpectFree(ctx context.Context, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args []any, dest ...any) (ClaimOrRead, error) {
	return g.exec(ctx, false, req, status, cp, completion, resourceType, resourceID, args, dest)
}

// exec is Exec, or without read ExecExpectFree.
func (g *ClaimOrReadGroup) exec(ctx context.Context, read bool, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args []any, dest []any) (ClaimOrRead, error) {
	all, err := claimArgs(g.single.nArgs, req, status, cp, completion, resourceType, resourceID, args)
	if err != nil {
		return ClaimOrRead{}, err
	}
	ctx, span := telemetry.Start(ctx, "idem.claim", trace.SpanKindInternal)
	defer span.End()
	if g.g == nil {
		return g.alone(ctx, req, read, all, dest)
	}
	alone := func(ctx context.Context) (ClaimOrRead, error) { return g.alone(ctx, req, read, all, dest) }
	out, err := g.g.do(ctx, groupClaimIn{req: req, args: all, dest: dest, alone: alone})
	if errors.Is(err, errClaimAlone) {
		return alone(ctx)
	}
	return out, err
}

// alone is single's statement for one claim, with all, the arguments
// claimArgs made; without read, its plain claim.
func (g *ClaimOrReadGroup) alone(ctx context.Context, req idem.BeginRequest, read bool, all, dest []any) (out ClaimOrRead, err error) {
	err = g.s.ExecOne(ctx, func(q Querier) (err error) {
		out, err = g.single.exec(ctx, q, req, read, all, dest)
		return err
	})
	return out, err
}

// write is the group's batch: one claim is single's statement; more are
// the batch statement, whose failure sends each claim alone unless its
// commit's outcome is unknown.
func (g *ClaimOrReadGroup) write(ctx context.Context, batch []*groupItem[groupClaimIn, ClaimOrRead]) {
	if len(batch) == 1 {
		// One claim is single's statement, under the context of the
		// caller that runs the batch; the group waits for it as for a
		// batch.
		it := batch[0]
		it.out, it.err = it.in.alone(ctx)
		return
	}
	claimsFailed(batch, g.s.execBatch(ctx, func(q Querier) error { return g.batch(ctx, q, batch) }))
}

// batch runs batch's claims in one statement through q and sets each
// one's outcome.
func (g *ClaimOrReadGroup) batch(ctx context.Context, q Querier, batch []*groupItem[groupClaimIn, ClaimOrRead]) error {
	nOwn := g.single.nArgs
	all := make([][]any, len(batch))
	for i, it := range batch {
		it.out = ClaimOrRead{}
		// The row's index, the record's columns, then the operation's.
		all[i] = append(append(append(make([]any, 0, 1+len(it.in.args)), int32(i)), it.in.args[nOwn:]...), it.in.args[:nOwn]...)
	}
	args, err := columnArrays(g.types, all)
	if err != nil {
		return err
	}
	rows, err := q.Query(ctx, g.sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	inserted, written := 0, int64(-1)
	for rows.Next() {
		var (
			i   int32
			now time.Time
			ins bool
			n   *int64
		)
		head := []any{&i, &now, &ins, &n}
		if err := scanHead(rows, head...); err != nil {
			return err
		}
		if i < 0 || int(i) >= len(batch) {
			return fmt.Errorf("store: claim-or-read batch: a row for claim %d of %d", i, len(batch))
		}
		it := batch[i]
		if ins {
			inserted++
			if n != nil {
				written = *n
			}
			it.out = ClaimOrRead{Inserted: true, At: now}
			continue
		}
		rec, err := scanRecord(skipHead{rows, len(head)}, it.in.dest...)
		if err != nil {
			return err
		}
		it.out.Decision, it.out.Settled, _ = settledDecision(rec, nil, it.in.req, now)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	if inserted > 0 && written != int64(inserted) {
		return fmt.Errorf("store: claim-or-read batch: %d claims inserted and %d of the operation's writes", inserted, written)
	}
	for _, it := range batch {
		if it.out.Settled && answered(it.out.Decision) {
			// One for the batch: it covers every record it read.
			return durable(ctx, q)
		}
	}
	return nil
}

// recordArgTypes are the SQL types of a claim's record arguments, in
// claimArgs' order.
var recordArgTypes = []string{"TEXT", "TEXT", "TEXT", "TEXT", "INT4", "TEXT", "TEXT", "TEXT", "INT8", "TEXT", "INT8",
	"INT4", "JSONB", "BYTEA", "TEXT", "BOOL", "TEXT", "TEXT", "TEXT", "TEXT"}

// claimOrReadBatchSQL is the batch form of a ClaimOrReadWith, whose rows
// (an index, the record's arguments, the operation's) are of types:
// it inserts the free keys (sorted, so that keys go in one order in every
// batch of every node, and two batches that wait on each other's keys
// cannot wait in a cycle), runs the operation's writes for the keys it
// inserted, and reads, as of the statement's snapshot, the records that
// hold the others with the rows they reference. Each row starts with its
// claim's index, the statement's time, whether it was inserted and (for
// inserted ones) how many rows the operation's last write returned.
func claimOrReadBatchSQL(own string, types []string, resourceType, row string, columns []string) string {
	cols := []string{"i"}
	for i := range recordArgTypes {
		cols = append(cols, "r"+strconv.Itoa(i+1))
	}
	for i := range types[len(cols):] {
		cols = append(cols, "a"+strconv.Itoa(i+1))
	}
	nulls := make([]string, len(columns)+strings.Count(recordColumns, ",")+1)
	for i := range nulls {
		nulls[i] = "NULL"
	}
	same := func(t string) string {
		return t + ".tenant_id = v.r1 AND " + t + ".operation_name = v.r2 AND " + t + ".idempotency_key = v.r3"
	}
	return `WITH v AS (SELECT * FROM ` + unnestRows("v", 1, types, cols) + `),
	claim AS (
		INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
			 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at,
			 response_status, response_headers, response_body, response_schema_version, response_by_reference,
			 resource_type, resource_id, raw_hash, claim_id)
		SELECT r1, r2, r3, r4, r5, r6, r7, r8, 1,
			CASE WHEN r6 = 'IN_PROGRESS' THEN now() + r9 * INTERVAL '1 millisecond' END,
			r10, now(), now(), now() + r11 * INTERVAL '1 millisecond',
			r12, r13, r14, r15, r16, r17, r18, r19, r20
		FROM v ORDER BY r1, r2, r3
		ON CONFLICT DO NOTHING
		RETURNING tenant_id, operation_name, idempotency_key
	),
	claimed AS (SELECT v.* FROM v JOIN claim c ON ` + same("c") + `)
	` + own + `
	SELECT i, now(), true, (SELECT count(*) FROM written), ` + strings.Join(nulls, ", ") + `
		FROM claimed
	UNION ALL
	SELECT v.i, now(), false, NULL, ` + qualified("r.", recordColumns) + `, ` + qualified("x.", strings.Join(columns, ", ")) + `
		FROM v JOIN idempotency_records r ON ` + same("r") + `
		` + referenceJoin(resourceType, row) + `
		WHERE NOT EXISTS (SELECT 1 FROM claim c WHERE ` + same("c") + `)`
}

// Queued reports how many claims wait for a batch.
func (g *ClaimOrReadGroup) Queued() int {
	if g.g == nil {
		return 0
	}
	return g.g.queued()
}

// InFlight reports how many batches are in flight or about to start.
func (g *ClaimOrReadGroup) InFlight() int {
	if g.g == nil {
		return 0
	}
	g.g.mu.Lock()
	defer g.g.mu.Unlock()
	return g.g.running
}

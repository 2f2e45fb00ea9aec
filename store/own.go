package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
)

// An operation with tables of its own (an order and its outbox event
// written with each record, say) uses two things of the store:
// ClaimWith, a claim that writes the operation's rows in the same
// statement, and ReferenceRead, the replay fast path's read joined with the
// row a referencing record renders its answer from. ClaimOrReadWith
// does both in one round trip, and ClaimOrReadGroup sends the claims of
// concurrent requests together. Everything else an operation writes goes
// through Querier, ExecOne, ExecTx and Read with SQL of its own.

// ClaimWith is a claim statement that also writes an operation's own rows:
// the record is inserted first (ON CONFLICT DO NOTHING) in a common table
// expression named claim, and the operation's SQL, which follows it in the
// same statement, writes only FROM claim, so that its rows exist exactly
// when the claim inserted the record. Make one with NewClaimWith, once.
type ClaimWith struct {
	sql   string
	nArgs int
}

// NewClaimWith prepares a claim with an operation's own writes. own follows
// "WITH claim AS (...)": further common table expressions (", pay AS (...)")
// and a final statement, each reading FROM claim (or from one that does);
// the final statement returns one row of one column, the statement's time
// (RETURNING now()), when it wrote. Its placeholders are $1 to $nArgs, the
// arguments Exec is given.
func NewClaimWith(own string, nArgs int) ClaimWith {
	return ClaimWith{sql: claimCTE(nArgs, "1 AS n") + "\n" + own, nArgs: nArgs}
}

// claimCTE is the common table expression claim: the record's insert
// (ON CONFLICT DO NOTHING) with its placeholders after the operation's
// nArgs, returning returning.
func claimCTE(nArgs int, returning string) string {
	p := func(i int) string { return fmt.Sprintf("$%d", nArgs+i) }
	return `WITH claim AS (
		INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
			 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at,
			 response_status, response_headers, response_body, response_schema_version, response_by_reference,
			 resource_type, resource_id, raw_hash, claim_id)
		VALUES (` + strings.Join([]string{p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8)}, ", ") + `, 1,
			CASE WHEN ` + p(6) + ` = 'IN_PROGRESS' THEN now() + ` + p(9) + `::INT8 * INTERVAL '1 millisecond' END,
			` + p(10) + `, now(), now(), now() + ` + p(11) + `::INT8 * INTERVAL '1 millisecond',
			` + strings.Join([]string{p(12), p(13), p(14), p(15), p(16), p(17), p(18), p(19), p(20)}, ", ") + `)
		ON CONFLICT DO NOTHING
		RETURNING ` + returning + `
	)`
}

// Exec claims req's key in state status at checkpoint cp (with completion's
// answer stored when it is not nil, for a record written COMPLETED),
// naming resourceType and resourceID, and writes the operation's rows
// with args, in one statement through q (which may run it as an implicit
// transaction of its own: Store.ExecOne).
//
// It reports whether this call inserted the claim, and the statement's
// time when it did. When it did not, nothing was written and the caller
// decides from the existing record (DecideExisting). An error of the
// operation's SQL (a unique violation of its own table, say) is returned
// as it is, for the operation to classify; nothing was written then.
func (c ClaimWith) Exec(ctx context.Context, q Querier, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args ...any) (inserted bool, at time.Time, err error) {
	all, err := claimArgs(c.nArgs, req, status, cp, completion, resourceType, resourceID, args)
	if err != nil {
		return false, time.Time{}, err
	}
	ctx, span := telemetry.Start(ctx, "idem.claim", trace.SpanKindInternal)
	defer span.End()
	err = q.QueryRow(ctx, c.sql, all...).Scan(&at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The key has a record: the claim inserted nothing, so neither
		// did the writes that follow from it.
		return false, time.Time{}, nil
	case err != nil:
		return false, time.Time{}, err
	}
	return true, at, nil
}

// claimArgs are the arguments of a claim statement with an operation's own
// writes: the operation's (nArgs of them), then the record's.
func claimArgs(nArgs int, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args []any) ([]any, error) {
	if len(args) != nArgs {
		return nil, fmt.Errorf("store: claim with own writes: %d arguments, the statement takes %d", len(args), nArgs)
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var resp *idem.Response
	if completion != nil {
		resp = &completion.Response
	}
	r, err := responseColumns(resp)
	if err != nil {
		return nil, err
	}
	return append(args[:len(args):len(args)],
		req.Tenant, req.Operation, req.Key, req.RequestHashes[0], req.HashVersion, string(status), string(cp),
		req.Owner, req.LockFor.Milliseconds(), req.HomeRegion, req.Window.Milliseconds(),
		r.status, r.headers, r.body, r.schema, r.byReference, resourceType, resourceID, nullable(req.RawHash),
		nullable(req.ClaimID)), nil
}

// ReferenceRead is the replay fast path's read (ReadSettled) joined with
// the row of an operation's table that a referencing record
// (idem.Response.ByReference) renders its answer from, so that the replay
// of such a record costs one round trip too. Make one with
// NewReferenceRead, once.
type ReferenceRead struct {
	sql string
}

// NewReferenceRead prepares the read of records of resourceType joined
// with row: a query of at most one row of the operation's table, keyed on
// the tenant ($1) and the record's resource id (r.resource_id), ending in
// its WHERE clause (the store appends its conditions on the record), for
// example "SELECT * FROM orders WHERE tenant_id = $1 AND order_id =
// r.resource_id". It is a LATERAL subquery keyed on its table's primary
// key, so that its lookup is one index probe whatever the planner believes
// of the tables' sizes (as a plain join, a generic plan made while the
// tables were small scanned every row of the tenant for each read).
// columns are the row's columns Read scans, in order.
func NewReferenceRead(resourceType, row string, columns ...string) ReferenceRead {
	joined := make([]string, len(columns))
	for i, c := range columns {
		joined[i] = "x." + c
	}
	return ReferenceRead{sql: `SELECT ` + qualified("r.", recordColumns) + `, now(), ` + strings.Join(joined, ", ") + `
	FROM idempotency_records r ` + referenceJoin(resourceType, row) + `
	WHERE r.tenant_id = $1 AND r.operation_name = $2 AND r.idempotency_key = $3
	AND r.status IN ` + settledStatuses + ` AND r.expires_at > now()`}
}

// ReadSettledWith is ReadSettled with rr's row: dest receives its columns
// (pointers to pointers, left nil when the record references no row or
// the row is gone). ok is false, with nothing decided, when the fast path
// decides nothing (no settled record, the store's NoReplayRead, a read the
// claim should retry).
func (s *Store) ReadSettledWith(ctx context.Context, req idem.BeginRequest, rr ReferenceRead, dest ...any) (d idem.Decision, ok bool, err error) {
	if !s.replayRead || len(req.RequestHashes) == 0 {
		return idem.Decision{}, false, nil
	}
	err = s.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		var now time.Time
		rec, err := scanRecord(c.QueryRow(ctx, rr.sql, req.Tenant, req.Operation, req.Key), append([]any{&now}, dest...)...)
		d, ok, err = durableDecision(ctx, c)(settledDecision(rec, err, req, now))
		return err
	})
	if err != nil {
		return idem.Decision{}, false, settledReadError(err)
	}
	return d, ok, nil
}

// referenceJoin joins a record r with the row x of the operation's table
// it references (row, keyed on r.resource_id), when it references one of
// resourceType.
func referenceJoin(resourceType, row string) string {
	return `LEFT JOIN LATERAL (` + row + `
		AND r.response_by_reference AND r.resource_type = ` + quoteLiteral(resourceType) + `
		LIMIT 1) x ON true`
}

// qualified prefixes each column of a comma-separated list.
func qualified(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// ClaimOrReadWith is a ClaimWith whose statement, when the key is taken,
// also reads the record that holds it, joined with the row a referencing
// record renders its answer from (as ReferenceRead does), in the same
// round trip: a fresh key costs the claim and the operation's writes
// alone, and a settled key is answered from that one round trip with
// nothing written. Make one with NewClaimOrReadWith, once.
type ClaimOrReadWith struct {
	sql string
	// plain is the claim and the operation's writes without the read:
	// see ClaimOrReadGroup.ExecExpectFree.
	plain string
	nArgs int
}

// NewClaimOrReadWith prepares a claim with an operation's own writes that
// reads the key's record when the claim finds it taken. own follows
// "WITH claim AS (...)" as in NewClaimWith, but holds common table
// expressions only, the last of which is named written and returns one
// row of one column, at (RETURNING now() AS at), when it wrote. Its
// placeholders are $1 to $nArgs, and $1 must be the request's tenant:
// row, the query of the operation's table as NewReferenceRead takes it,
// is keyed on it. columns are row's columns Exec scans, in order.
func NewClaimOrReadWith(own string, nArgs int, resourceType, row string, columns ...string) ClaimOrReadWith {
	claim := claimCTE(nArgs, "1 AS n") + "\n" + own
	p := func(i int) string { return fmt.Sprintf("$%d", nArgs+i) }
	// A fresh key's row is the statement's time, true and its writes' time,
	// and NULL for every column of the record and the row: the caller has
	// them already, and neither the server nor the client spends anything
	// on them.
	nulls := make([]string, len(columns)+strings.Count(recordColumns, ",")+1)
	joined := make([]string, len(columns))
	for i := range nulls {
		nulls[i] = "NULL"
	}
	for i, c := range columns {
		joined[i] = "x." + c
	}
	// The record a statement's own claim inserted is not visible to the
	// rest of it (one snapshot), so the second branch finds only a record
	// committed before it began; the first, the one it inserted.
	sql := claim + `
	SELECT now(), true, (SELECT at FROM written), ` + strings.Join(nulls, ", ") + `
		FROM claim c
	UNION ALL
	SELECT now(), false, NULL, ` + qualified("r.", recordColumns) + `, ` + strings.Join(joined, ", ") + `
		FROM idempotency_records r ` + referenceJoin(resourceType, row) + `
		WHERE r.tenant_id = ` + p(1) + ` AND r.operation_name = ` + p(2) + ` AND r.idempotency_key = ` + p(3) + `
		AND NOT EXISTS (SELECT 1 FROM claim)`
	plain := claim + `
	SELECT now(), true, (SELECT at FROM written) FROM claim`
	return ClaimOrReadWith{sql: sql, plain: plain, nArgs: nArgs}
}

// ClaimOrRead is what one ClaimOrReadWith.Exec found.
type ClaimOrRead struct {
	// Inserted reports that the statement claimed the key (and the
	// operation's writes ran); At is then the statement's time.
	Inserted bool
	At       time.Time
	// Settled reports, when the key was taken, that the record holding it
	// decided the request: Decision is a replay (dest then holds the
	// referenced row's columns, nil when it references none) or a
	// conflict. When neither is set, the record is open, retryable,
	// expired or not yet visible, and the caller decides in a transaction
	// (DecideExisting).
	Settled  bool
	Decision idem.Decision
}

// Exec is ClaimWith.Exec, and when the key is taken, the read of its
// record: see ClaimOrRead. dest are pointers to pointers, one per column
// of the row, as ReadSettledWith takes them.
func (c ClaimOrReadWith) Exec(ctx context.Context, q Querier, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, resourceType, resourceID string, args []any, dest ...any) (ClaimOrRead, error) {
	all, err := claimArgs(c.nArgs, req, status, cp, completion, resourceType, resourceID, args)
	if err != nil {
		return ClaimOrRead{}, err
	}
	ctx, span := telemetry.Start(ctx, "idem.claim", trace.SpanKindInternal)
	defer span.End()
	return c.exec(ctx, q, req, true, all, dest)
}

// exec sends the statement with all, the arguments claimArgs made; without
// read, the plain one, which returns no row when the key is taken.
func (c ClaimOrReadWith) exec(ctx context.Context, q Querier, req idem.BeginRequest, read bool, all []any, dest []any) (ClaimOrRead, error) {
	var (
		out ClaimOrRead
		now time.Time
		at  *time.Time
		rec *idem.Record
	)
	sql := c.sql
	if !read {
		sql = c.plain
	}
	rows, err := q.Query(ctx, sql, all...)
	if err != nil {
		return ClaimOrRead{}, err
	}
	if rows.Next() {
		// The head first; only a key found taken scans the record's and
		// the row's columns.
		err = scanHead(rows, &now, &out.Inserted, &at)
		if err == nil && !out.Inserted {
			rec, err = scanRecord(skipHead{rows, 3}, dest...)
		}
	}
	rows.Close()
	switch rerr := rows.Err(); {
	case rerr != nil:
		return ClaimOrRead{}, rerr
	case err != nil:
		return ClaimOrRead{}, err
	case out.Inserted:
		if at == nil {
			return ClaimOrRead{}, errors.New("store: claim or read with own writes: the claim was inserted and the operation's writes were not")
		}
		out.At = *at
		return out, nil
	case rec == nil:
		err = pgx.ErrNoRows
	}
	out.Decision, out.Settled, err = durableDecision(ctx, q)(settledDecision(rec, err, req, now))
	return out, err
}

// scanHead scans the first len(head) columns of rows' current row into
// head. Unlike rows.Scan with the rest nil, it plans the scan of those
// columns alone: a claim's row is mostly the record's and the operation's
// columns, NULL when the claim inserted, and planning each of them cost a
// fresh claim about a third of its allocations.
func scanHead(rows pgx.Rows, head ...any) error {
	fields, values := rows.FieldDescriptions(), rows.RawValues()
	if len(fields) < len(head) || len(values) != len(fields) {
		// rows.Scan reports the mismatch.
		return rows.Scan(head...)
	}
	if conn := rows.Conn(); conn != nil {
		return pgx.ScanRow(conn.TypeMap(), fields[:len(head)], values[:len(head)], head...)
	}
	return rows.Scan(append(head, make([]any, len(fields)-len(head))...)...)
}

// skipHead scans the current row of rows past its first n columns.
type skipHead struct {
	rows pgx.Rows
	n    int
}

func (s skipHead) Scan(dest ...any) error {
	return s.rows.Scan(append(make([]any, s.n), dest...)...)
}

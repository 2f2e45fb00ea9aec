package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/ctxtime"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Querier is what record and domain functions need from a transaction or pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// recordColumns is the select list every record read uses, in scanRecord's order.
const recordColumns = `tenant_id, operation_name, idempotency_key, request_hash, hash_version,
	status, checkpoint, owner, fencing_token, locked_until, attempts, generation,
	response_status, response_headers, response_body, response_schema_version,
	resource_type, resource_id, error_code, home_region, created_at, updated_at, expires_at,
	response_by_reference, raw_hash`

type rowScanner interface{ Scan(dest ...any) error }

// scanRecord scans recordColumns (and any extra destinations after them).
func scanRecord(row rowScanner, extra ...any) (*idem.Record, error) {
	// Nullable columns scan into value types: pgx scans a NULL into a
	// **T through a reflect-built plan and a new value per column and row.
	var (
		r                       idem.Record
		status, checkpoint      string
		respStatus              pgtype.Int4
		respHeaders             []byte
		respBody                []byte
		schema, resType, resID  pgtype.Text
		errCode, rawHash        pgtype.Text
		lockedUntil             pgtype.Timestamptz
		attempts, generation, v int32
		byReference             bool
	)
	dest := []any{&r.Tenant, &r.Operation, &r.Key, &r.RequestHash, &v,
		&status, &checkpoint, &r.Owner, &r.FencingToken, &lockedUntil, &attempts, &generation,
		&respStatus, &respHeaders, &respBody, &schema,
		&resType, &resID, &errCode, &r.HomeRegion, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &byReference, &rawHash}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	r.HashVersion, r.Attempts, r.Generation = int(v), int(attempts), int(generation)
	r.Status, r.Checkpoint = idem.Status(status), idem.Checkpoint(checkpoint)
	if lockedUntil.Valid {
		r.LockedUntil = &lockedUntil.Time
	}
	r.ResourceType, r.ResourceID, r.ErrorCode, r.RawHash = resType.String, resID.String, errCode.String, rawHash.String
	if respStatus.Valid {
		r.Response = &idem.Response{Status: int(respStatus.Int32), Body: respBody, SchemaVersion: schema.String, ByReference: byReference}
		if len(respHeaders) > 0 {
			if err := json.Unmarshal(respHeaders, &r.Response.Headers); err != nil {
				return nil, fmt.Errorf("store: decode response headers: %w", err)
			}
		}
	}
	return &r, nil
}

// Begin implements idem.Coordinator: it claims the scoped key with one atomic
// insert (a transaction of its own sent in one round trip, see ExecOne), or, when the
// key has a record, decides what that record allows in a serializable
// transaction. A stale, retryable or expired record is taken over by a
// conditional update that bumps the fencing token, inside that transaction,
// so exactly one of many concurrent requests wins it.
func (s *Store) Begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	ctx, span := telemetry.Start(ctx, "idem.claim", trace.SpanKindInternal)
	defer span.End()
	if err := req.Validate(); err != nil {
		return idem.Decision{}, err
	}
	claim := req.ClaimID
	var err error
	if claim == "" {
		if claim, err = newClaimID(); err != nil {
			return idem.Decision{}, err
		}
	}
	var d idem.Decision
	run := func(tx pgx.Tx) error {
		var err error
		d, err = decideOrClaim(ctx, tx, req, claim)
		return err
	}
	// A free key is claimed by the insert alone, as an implicit
	// transaction (one round trip), which also reads the record that holds
	// the key otherwise: a settled one answers a replay (or a conflict)
	// from that same round trip, with nothing written. Any other record is
	// decided in a transaction that reads it first.
	// The claims of concurrent requests share that statement (group
	// commit, see newClaims).
	settled := false
	alone := func() error {
		return s.ExecOne(ctx, func(q Querier) error {
			var err error
			d, settled, err = s.claimOrRead(ctx, q, req, claim)
			return err
		})
	}
	if s.claims != nil && s.replayRead {
		var out claimOut
		out, err = s.claims.do(ctx, claimIn{req: req, claim: claim})
		d, settled = out.d, out.done
		if errors.Is(err, errClaimAlone) {
			err = alone()
		}
	} else {
		err = alone()
	}
	if err == nil {
		s.taken.Observe(!settled || d.Outcome != idem.OutcomeExecute)
	}
	if err == nil && !settled {
		err = s.ExecTx(ctx, run)
	}
	// A claim whose commit went unanswered may hold the record: decide
	// again. That finds the record this claim id took (and goes on with
	// it), or another's record to decide on, or a free key to claim.
	for attempt := 1; errors.Is(err, ErrCommitUnknown) && attempt <= resolveAttempts; attempt++ {
		if perr := pause(ctx, attempt); perr != nil {
			break
		}
		s.logger.WarnContext(ctx, "claim commit outcome unknown; resolving it by its claim id", "attempt", attempt)
		err = s.ExecTx(ctx, run)
	}
	if err != nil {
		return idem.Decision{}, fmt.Errorf("store: begin: %w", err)
	}
	return d, nil
}

// resolveAttempts bounds how often a write whose commit outcome is unknown
// is read back or run again before the store reports itself unavailable.
const resolveAttempts = 8

// pause waits before resolution attempt n+1 (25 ms doubling, capped at
// 400 ms): long enough for the pool to replace the dropped connection.
func pause(ctx context.Context, n int) error {
	return ctxtime.Sleep(ctx, min(25*time.Millisecond<<min(n-1, 4), 400*time.Millisecond))
}

// openStatus reports whether a record in st still takes writes under its
// owner's lease (the fenced statuses).
func openStatus(st idem.Status) bool {
	return st == idem.StatusInProgress || st == idem.StatusUnknown
}

// newClaimID draws the random identity of one claim (see claim_id).
func newClaimID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("store: claim id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// settledStatuses are the states a record cannot leave before its window
// ends: nothing but the expiry takeover (which needs expires_at past) and
// cleanup (likewise) ever writes such a record again.
const settledStatuses = `('COMPLETED', 'FAILED_REPLAYABLE')`

// ReadSettled is the replay fast path: one indexed read of req's scope,
// outside any transaction and before any insert attempt. A record that is
// COMPLETED or FAILED_REPLAYABLE and still inside its window (by the store's
// clock) is immutable, so its answer is decided from this read alone: replay
// when req's command hashes like the record's (under any hash version req
// carries), conflict otherwise. It reports ok=false (and no error) when the
// key has no such record (absent, in progress, retryable, unknown, expired)
// or the fast path is turned off: the caller then claims with the atomic
// insert as always. The decision never grants execution rights.
func (s *Store) ReadSettled(ctx context.Context, req idem.BeginRequest) (d idem.Decision, ok bool, err error) {
	if !s.replayRead {
		return idem.Decision{}, false, nil
	}
	// On a connection of its own: a read that answers is made durable on
	// the server it read (durable).
	err = s.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) (err error) {
		d, ok, err = readSettledTx(ctx, c, req)
		return err
	})
	if err != nil {
		return idem.Decision{}, false, settledReadError(err)
	}
	return d, ok, nil
}

// settledReadError is what a failed fast-path read returns: nil (the
// caller claims as if the read had found nothing) when fallThrough says
// so, the error otherwise.
func settledReadError(err error) error {
	if fallThrough(err) {
		return nil
	}
	return fmt.Errorf("store: read settled record: %w", Classify(err))
}

// fallThrough reports whether a failed fast-path read should leave the
// decision to the claim instead of failing the request: the read is only a
// shortcut, and a serialization failure or deadlock (the read runs at the
// store's SERIALIZABLE default, where even a reader can be chosen as the
// victim) says nothing about the key. The claim's transaction retries such
// failures itself.
func fallThrough(err error) bool {
	switch sqlState(err) {
	case codeSerializationFailure, codeDeadlock:
		return true
	}
	return false
}

// readSettledTx is ReadSettled through q, whatever the store's options.
func readSettledTx(ctx context.Context, q Querier, req idem.BeginRequest) (idem.Decision, bool, error) {
	if len(req.RequestHashes) == 0 {
		return idem.Decision{}, false, nil
	}
	var now time.Time
	rec, err := scanRecord(q.QueryRow(ctx, settledRecordSQL, req.Tenant, req.Operation, req.Key), &now)
	return durableDecision(ctx, q)(settledDecision(rec, err, req, now))
}

// settledRecordSQL is the fast path's read of a settled record, and the
// store's time.
const settledRecordSQL = `SELECT ` + recordColumns + `, now()
	FROM idempotency_records WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3
	AND status IN ` + settledStatuses + ` AND expires_at > now()`

// settledDecision decides from a fast-path read of a settled record (rec,
// err from its scan): replay or conflict, or ok=false for no such record
// or any other outcome.
func settledDecision(rec *idem.Record, err error, req idem.BeginRequest, now time.Time) (idem.Decision, bool, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Decision{}, false, nil
	}
	if err != nil {
		return idem.Decision{}, false, err
	}
	switch outcome := idem.Decide(rec, req.RequestHashes, now); outcome {
	case idem.OutcomeReplay, idem.OutcomeConflict:
		return idem.Decision{Outcome: outcome, Record: rec}, true, nil
	}
	return idem.Decision{}, false, nil
}

// ClaimTx is Begin inside the caller's transaction, for operations whose
// business writes commit together with the claim: it claims the key with
// the insert-first statement, or decides on the record that holds it. It
// begins no transaction; tx is the caller's.
func ClaimTx(ctx context.Context, tx Querier, req idem.BeginRequest) (idem.Decision, error) {
	return claimTx(ctx, tx, req, "")
}

// claimTx claims under claim, the claim's random id ("" records none). A
// record that claim already holds (an earlier run of this same claim whose
// COMMIT went unanswered did commit) is this claim's: it is returned as
// granted, never decided against as someone else's.
func claimTx(ctx context.Context, tx Querier, req idem.BeginRequest, claim string) (idem.Decision, error) {
	d, ok, err := insertClaim(ctx, tx, req, claim)
	if err != nil || ok {
		return d, err
	}
	return decideExisting(ctx, tx, req, claim)
}

// decideOrClaim decides what the record that took the key allows (or
// finds claim's own earlier run), and claims the key if the record has gone
// meanwhile (cleanup).
func decideOrClaim(ctx context.Context, tx Querier, req idem.BeginRequest, claim string) (idem.Decision, error) {
	d, err := decideExisting(ctx, tx, req, claim)
	if !errors.Is(err, pgx.ErrNoRows) {
		return d, err
	}
	d, ok, err := insertClaim(ctx, tx, req, claim)
	if err == nil && !ok {
		// Taken again by a transaction this one cannot see: what
		// SERIALIZABLE reports as a serialization failure, retried.
		return idem.Decision{}, &pgconn.PgError{Code: codeSerializationFailure, Message: "store: the key was claimed concurrently"}
	}
	return d, err
}

// claimInsert is the insert-first claim's statement up to its RETURNING
// list: the record of a free key, in progress under a fencing token of 1;
// a key with a record inserts nothing.
const claimInsert = `INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
		 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at, claim_id, raw_hash)
		VALUES ($1, $2, $3, $4, $5, 'IN_PROGRESS', $11, $6, 1,
		 now() + $7::INT8 * INTERVAL '1 millisecond', $8, now(), now(), now() + $9::INT8 * INTERVAL '1 millisecond', $10, $12)
		ON CONFLICT DO NOTHING
		RETURNING `

// claimOrReadSQL is the insert-first claim and, when the key is taken, a
// read of the record that took it (as of the statement's snapshot: a record
// committed concurrently is not seen, and the caller decides in a
// transaction), with the store's time. The first column says which.
const claimOrReadSQL = `WITH ins AS (` + claimInsert + recordColumns + `)
	SELECT ` + recordColumns + `, now(), true FROM ins
	UNION ALL
	SELECT ` + recordColumns + `, now(), false FROM idempotency_records
		WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND NOT EXISTS (SELECT 1 FROM ins)`

// claimOrRead claims a free key in one statement (claimOrReadSQL) and
// answers from the same round trip a key whose record is settled (replay or
// conflict, idem.Decide at the store's time). done is false when the
// decision needs a transaction: the key's record is open, retryable,
// expired or not yet visible, or the store's replay fast path is off.
//
// While few of the store's recent claims found their key taken
// (readInClaimAbove), the claim is the plain insert instead (insertClaim),
// and a key it finds taken is decided by the transaction after it (done
// false): a fresh key's claim then costs the server less (no read's plan
// started, no record's row prepared), and a retry a round trip more.
func (s *Store) claimOrRead(ctx context.Context, q Querier, req idem.BeginRequest, claim string) (d idem.Decision, done bool, err error) {
	if !s.replayRead || !s.taken.Above(readInClaimAbove) {
		d, inserted, err := insertClaim(ctx, q, req, claim)
		return d, inserted, err
	}
	var (
		now      time.Time
		inserted bool
	)
	rec, err := scanRecord(q.QueryRow(ctx, claimOrReadSQL,
		req.Tenant, req.Operation, req.Key, req.RequestHashes[0], req.HashVersion,
		req.Owner, req.LockFor.Milliseconds(), req.HomeRegion, req.Window.Milliseconds(), nullable(claim), string(req.StartCheckpoint()),
		nullable(req.RawHash)), &now, &inserted)
	switch {
	case err == nil && inserted:
		return idem.Decision{Outcome: idem.OutcomeExecute, Lease: leaseOf(rec), Record: rec}, true, nil
	case err == nil || errors.Is(err, pgx.ErrNoRows):
		return durableDecision(ctx, q)(settledDecision(rec, err, req, now))
	}
	return idem.Decision{}, false, fmt.Errorf("claim: %w", err)
}

// readInClaimAbove is the share of the store's recent claims that found
// their key taken above which a claim alone reads the record that took it
// in the same statement (claimOrReadSQL); at or below it the claim is the
// plain insert (insertClaim), and the record is read after it. A tenth, as
// payments' claims choose (docs/benchmarks.md, "A plain claim while
// retries are rare").
const readInClaimAbove = 0.1

// insertClaimSQL is the insert-first claim alone. It returns the
// statement's time, not the record: the record it inserted is what its
// arguments and that time make (claimedRecord), and the server prepares no
// row of the record's columns.
const insertClaimSQL = claimInsert + `created_at`

// insertClaim is the insert-first claim alone, one statement that reads
// nothing: ok reports that it inserted the record (the key was free), and
// the decision is to execute.
func insertClaim(ctx context.Context, q Querier, req idem.BeginRequest, claim string) (d idem.Decision, ok bool, err error) {
	var at time.Time
	err = q.QueryRow(ctx, insertClaimSQL,
		req.Tenant, req.Operation, req.Key, req.RequestHashes[0], req.HashVersion,
		req.Owner, req.LockFor.Milliseconds(), req.HomeRegion, req.Window.Milliseconds(), nullable(claim), string(req.StartCheckpoint()),
		nullable(req.RawHash)).Scan(&at)
	switch {
	case err == nil:
		rec := claimedRecord(req, at)
		return idem.Decision{Outcome: idem.OutcomeExecute, Lease: leaseOf(rec), Record: rec}, true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return idem.Decision{}, false, nil
	}
	return idem.Decision{}, false, fmt.Errorf("claim: %w", err)
}

// claimedRecord is the record an insert-first claim of req inserted at the
// store's time at, as the insert writes it.
func claimedRecord(req idem.BeginRequest, at time.Time) *idem.Record {
	ms := func(d time.Duration) time.Duration { return time.Duration(d.Milliseconds()) * time.Millisecond }
	locked := at.Add(ms(req.LockFor))
	return &idem.Record{Scope: req.Scope, RequestHash: req.RequestHashes[0], RawHash: req.RawHash, HashVersion: req.HashVersion,
		Status: idem.StatusInProgress, Checkpoint: req.StartCheckpoint(), Owner: req.Owner, FencingToken: 1,
		LockedUntil: &locked, Attempts: 1, HomeRegion: req.HomeRegion,
		CreatedAt: at, UpdatedAt: at, ExpiresAt: at.Add(ms(req.Window))}
}

// DecideExisting reads the existing record of req's scope and applies
// idem.Decide at the store's time, taking ownership when the decision
// allows. A record still open under req.ClaimID is this request's own
// (its earlier claim's commit went unanswered, see ClaimID): its lease is
// handed back, as OutcomeExecute when the record is as the claim inserted
// it (first attempt, at req's start checkpoint), else OutcomeRecover.
func DecideExisting(ctx context.Context, tx Querier, req idem.BeginRequest) (idem.Decision, error) {
	return decideExisting(ctx, tx, req, req.ClaimID)
}

func decideExisting(ctx context.Context, tx Querier, req idem.BeginRequest, claim string) (idem.Decision, error) {
	var (
		now    time.Time
		holder *string
	)
	rec, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordColumns+`, now(), claim_id
		FROM idempotency_records WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3`,
		req.Tenant, req.Operation, req.Key), &now, &holder)
	if err != nil {
		// No row after a conflicting insert means it was deleted in between
		// (cleanup); the serializable retry sorts it out.
		return idem.Decision{}, fmt.Errorf("read existing record: %w", err)
	}
	var held string
	if holder != nil {
		held = *holder
	}
	if outcome, ok := idem.DecideOwnClaim(rec, claim, held, req.StartCheckpoint()); ok {
		// This claim's own earlier run committed: an insert or a takeover.
		return idem.Decision{Outcome: outcome, Lease: leaseOf(rec), Record: rec}, nil
	}
	outcome := idem.Decide(rec, req.RequestHashes, now)
	var taken *idem.Record
	switch outcome {
	case idem.OutcomeRecover:
		if req.ExternalFencing && req.FencingToken == 0 {
			return idem.Decision{Outcome: outcome, Record: rec}, nil
		}
		if req.FencingToken != 0 && req.FencingToken <= rec.FencingToken {
			return idem.Decision{}, fmt.Errorf("take over with token %d, record has %d: %w", req.FencingToken, rec.FencingToken, idem.ErrFenced)
		}
		// $7 = 0: the store's own counter; otherwise the external token.
		taken, err = scanRecord(tx.QueryRow(ctx, `UPDATE idempotency_records SET
			status = 'IN_PROGRESS', owner = $5,
			fencing_token = CASE WHEN $7::INT8 > 0 THEN $7::INT8 ELSE fencing_token + 1 END,
			locked_until = now() + $6::INT8 * INTERVAL '1 millisecond', attempts = attempts + 1, updated_at = now(),
			claim_id = $8
			WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND fencing_token = $4
			RETURNING `+recordColumns,
			req.Tenant, req.Operation, req.Key, rec.FencingToken, req.Owner, req.LockFor.Milliseconds(), req.FencingToken, nullable(claim)))
	case idem.OutcomeExpired:
		taken, err = scanRecord(tx.QueryRow(ctx, `UPDATE idempotency_records SET
			request_hash = $5, hash_version = $6, status = 'IN_PROGRESS', checkpoint = 'RECEIVED',
			owner = $7, fencing_token = fencing_token + 1,
			locked_until = now() + $8::INT8 * INTERVAL '1 millisecond', attempts = 1, generation = generation + 1,
			response_status = NULL, response_headers = NULL, response_body = NULL, response_schema_version = NULL,
			response_by_reference = false, resource_type = NULL, resource_id = NULL, error_code = NULL, home_region = $9,
			created_at = now(), updated_at = now(), expires_at = now() + $10::INT8 * INTERVAL '1 millisecond',
			claim_id = $11, raw_hash = $12,
			settled_as = NULL, settled_by = NULL, settled_at = NULL, settled_reason = NULL
			WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND fencing_token = $4
			RETURNING `+recordColumns,
			req.Tenant, req.Operation, req.Key, rec.FencingToken, req.RequestHashes[0], req.HashVersion,
			req.Owner, req.LockFor.Milliseconds(), req.HomeRegion, req.Window.Milliseconds(), nullable(claim), nullable(req.RawHash)))
	default:
		d := idem.Decision{Outcome: outcome, Record: rec}
		if answered(d) {
			if err := durable(ctx, tx); err != nil {
				return idem.Decision{}, err
			}
		}
		return d, nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// Someone else took it between our read and our update. Under
		// SERIALIZABLE this is reported as 40001 first; keep the guard anyway.
		return idem.Decision{Outcome: idem.OutcomeInProgress, Record: rec}, nil
	}
	if err != nil {
		return idem.Decision{}, fmt.Errorf("take over record: %w", err)
	}
	return idem.Decision{Outcome: outcome, Lease: leaseOf(taken), Record: taken, ExpiredRetry: outcome == idem.OutcomeExpired}, nil
}

func leaseOf(r *idem.Record) idem.Lease {
	return idem.Lease{Scope: r.Scope, Token: r.FencingToken, Owner: r.Owner}
}

// fenced is the WHERE clause of every write by an owner: the record is still
// open and its token is the writer's ($4). Tokens only ever rise (a takeover
// sets a higher one), so a writer whose token is lower than the highest the
// record has seen is rejected; a token the record never granted (higher, or
// forged by a remote caller) is rejected too.
//
// The status test is written as (...) IS TRUE (the same, status being NOT
// NULL) so that the planner cannot use the partial index
// idempotency_records_open, whose predicate a bare IN implies: PostgreSQL
// otherwise prefers a whole scan of that index to the primary key's probe
// (its statistics hold few live entries, while every record that completed
// since the last vacuum still has a dead one there), and each write then
// read all of those entries, and locked all of their pages for SSI.
const fenced = `tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND fencing_token = $4
	AND (status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')) IS TRUE`

func fencedExec(ctx context.Context, q Querier, lease idem.Lease, set string, args ...any) error {
	all := append([]any{lease.Tenant, lease.Operation, lease.Key, lease.Token}, args...)
	where := fenced
	if w, ok := unfencedWhere(lease); ok {
		where = w
	}
	tag, err := q.Exec(ctx, `UPDATE idempotency_records SET updated_at = now(), `+set+` WHERE `+where, all...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrFenced
	}
	return nil
}

// CheckpointTx records progress under lease in the caller's transaction and
// extends the owner's lock by lockFor (0 keeps it as is).
func CheckpointTx(ctx context.Context, q Querier, lease idem.Lease, cp idem.Checkpoint, lockFor time.Duration) error {
	if lockFor > 0 {
		return fencedExec(ctx, q, lease, `checkpoint = $5, locked_until = now() + $6::INT8 * INTERVAL '1 millisecond'`, string(cp), lockFor.Milliseconds())
	}
	return fencedExec(ctx, q, lease, `checkpoint = $5`, string(cp))
}

// CompleteTx stores the final answer under lease in the caller's transaction.
func CompleteTx(ctx context.Context, q Querier, lease idem.Lease, c idem.Completion) error {
	r, err := responseColumns(&c.Response)
	if err != nil {
		return err
	}
	return fencedExec(ctx, q, lease, `status = 'COMPLETED', checkpoint = 'COMPLETED', locked_until = NULL,
		response_status = $5, response_headers = $6, response_body = $7, response_schema_version = $8,
		response_by_reference = $9, resource_type = $10, resource_id = $11, error_code = NULL`,
		r.status, r.headers, r.body, r.schema, r.byReference, nullable(c.ResourceType), nullable(c.ResourceID))
}

// FailTx stores a classified failure under lease in the caller's transaction.
func FailTx(ctx context.Context, q Querier, lease idem.Lease, f idem.Failure) error {
	switch f.Status {
	case idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown:
	default:
		return idem.Errorf(idem.ECodeValidationFailed, "A failure must be FAILED_REPLAYABLE, FAILED_RETRYABLE or UNKNOWN_REQUIRES_RECOVERY.")
	}
	r, err := responseColumns(f.Response)
	if err != nil {
		return err
	}
	return fencedExec(ctx, q, lease, `status = $5, locked_until = NULL, error_code = $6,
		response_status = $7, response_headers = $8, response_body = $9, response_schema_version = $10,
		response_by_reference = $11`,
		string(f.Status), nullable(f.ErrorCode), r.status, r.headers, r.body, r.schema, r.byReference)
}

// Checkpoint implements idem.Coordinator. The checkpoints of concurrent
// requests are written together, as completions are (see Complete).
func (s *Store) Checkpoint(ctx context.Context, lease idem.Lease, cp idem.Checkpoint) error {
	write := func(q Querier) error { return CheckpointTx(ctx, q, lease, cp, 0) }
	first := func() error { return s.ExecOne(ctx, write) }
	if _, unfenced := unfencedWhere(lease); s.checkpoints != nil && !unfenced {
		first = func() error {
			_, err := s.checkpoints.do(ctx, checkpointIn{lease: lease, cp: cp})
			return err
		}
	}
	_, err := s.fencedWriteFirst(ctx, "checkpoint", lease, first, write,
		func(r *idem.Record) bool { return r.Checkpoint == cp && openStatus(r.Status) })
	return err
}

// Complete implements idem.Coordinator. The completions of concurrent
// requests are written together (group commit, see group): one
// statement and one commit for all that queued while the batches before
// were in flight, each still fenced by its own lease.
func (s *Store) Complete(ctx context.Context, lease idem.Lease, c idem.Completion) error {
	_, err := s.CompleteAcknowledged(ctx, lease, c)
	return err
}

// CompleteAcknowledged is Complete, and also reports whether the
// completion's own commit was acknowledged. It is false, with a nil
// error, when that commit's answer was lost and the record, read back,
// showed the completion written: the server showed a commit this node
// never saw acknowledged, which a primary cut off from its synchronous
// standbys can show before it loses it (see durable). The engine keeps in
// memory only the answers of acknowledged commits (engine.AnswerCache).
func (s *Store) CompleteAcknowledged(ctx context.Context, lease idem.Lease, c idem.Completion) (bool, error) {
	write := func(q Querier) error { return CompleteTx(ctx, q, lease, c) }
	first := func() error { return s.ExecOne(ctx, write) }
	if _, unfenced := unfencedWhere(lease); s.completions != nil && !unfenced {
		first = func() error { return s.completeInGroup(ctx, lease, c) }
	}
	return s.fencedWriteFirst(ctx, "complete", lease, first, write,
		func(r *idem.Record) bool { return r.Status == idem.StatusCompleted })
}

// Fail implements idem.Coordinator.
func (s *Store) Fail(ctx context.Context, lease idem.Lease, f idem.Failure) error {
	_, err := s.FailAcknowledged(ctx, lease, f)
	return err
}

// FailAcknowledged is Fail, and also reports whether the write's own
// commit was acknowledged (see CompleteAcknowledged).
func (s *Store) FailAcknowledged(ctx context.Context, lease idem.Lease, f idem.Failure) (bool, error) {
	return s.fencedWrite(ctx, "fail", lease, func(q Querier) error { return FailTx(ctx, q, lease, f) },
		func(r *idem.Record) bool { return r.Status == f.Status })
}

// fencedWrite runs fn, a write under lease in one statement (an implicit
// transaction, see ExecOne). When its commit goes unanswered
// the record is read back: written (its token is still lease's and it shows
// what fn writes) is success; still open under lease's token means the
// commit did not happen and fn runs again (fenced as always); anything else
// is idem.ErrFenced, as fn itself would have found. acknowledged reports a
// success of the first commit, answered: any other success went through a
// lost commit's answer.
func (s *Store) fencedWrite(ctx context.Context, what string, lease idem.Lease, fn func(Querier) error, written func(*idem.Record) bool) (acknowledged bool, err error) {
	return s.fencedWriteFirst(ctx, what, lease, func() error { return s.ExecOne(ctx, fn) }, fn, written)
}

// fencedWriteFirst is fencedWrite whose first attempt is first (a batch of
// several owners' writes, say) and whose attempts after an unanswered
// commit run fn alone.
func (s *Store) fencedWriteFirst(ctx context.Context, what string, lease idem.Lease, first func() error, fn func(Querier) error, written func(*idem.Record) bool) (acknowledged bool, err error) {
	err = first()
	if err == nil {
		return true, nil
	}
	for attempt := 1; errors.Is(err, ErrCommitUnknown) && attempt <= resolveAttempts; attempt++ {
		if perr := pause(ctx, attempt); perr != nil {
			break
		}
		s.logger.WarnContext(ctx, "record write commit outcome unknown; reading it back", "write", what, "attempt", attempt)
		rec, rerr := getTx(ctx, s.pool, lease.Scope)
		switch {
		case errors.Is(rerr, idem.ErrRecordNotFound):
			err = idem.ErrFenced
		case rerr != nil:
			// Still unreachable: the outcome stays unknown.
		case rec.FencingToken == lease.Token && written(rec):
			return false, nil
		case rec.FencingToken == lease.Token && openStatus(rec.Status):
			err = s.ExecOne(ctx, fn)
		default:
			err = idem.ErrFenced
		}
	}
	if err != nil {
		return false, fmt.Errorf("store: %s: %w", what, err)
	}
	return false, nil
}

// Now reads the store's clock: now(), the time every record time is
// taken from. The engine measures how long it may keep an answer it read
// from a record's expires_at and this (engine.AnswerCache).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.Read(ctx, func(q Querier) error { return q.QueryRow(ctx, `SELECT now()`).Scan(&now) })
	if err != nil {
		return time.Time{}, fmt.Errorf("store: now: %w", Classify(err))
	}
	return now, nil
}

// Get implements idem.Coordinator. It returns idem.ErrRecordNotFound when the
// scope has no record.
func (s *Store) Get(ctx context.Context, scope idem.Scope) (*idem.Record, error) {
	// A lone read at SERIALIZABLE may still be chosen to fail beside
	// concurrent writers (40001): retried as every read is (Read).
	var rec *idem.Record
	err := s.Read(ctx, func(q Querier) (err error) {
		rec, err = getTx(ctx, q, scope)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: get record: %w", Classify(err))
	}
	return rec, nil
}

// getTx reads the record of scope through q.
func getTx(ctx context.Context, q Querier, scope idem.Scope) (*idem.Record, error) {
	rec, err := scanRecord(q.QueryRow(ctx, `SELECT `+recordColumns+` FROM idempotency_records
		WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3`, scope.Tenant, scope.Operation, scope.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idem.ErrRecordNotFound
	}
	return rec, err
}

// storedResponse is a response as the record's columns hold it.
type storedResponse struct {
	status *int
	// headers is JSON text, not bytes: behind a transaction pooler the
	// query mode (exec) sends parameters with no type, and pgx writes
	// []byte as bytea's hex text, which a JSONB column cannot parse.
	headers     *string
	body        []byte
	schema      *string
	byReference bool
}

// responseColumns is what the record's response columns store for r (all
// NULL for nil). A referencing response (idem.Response.ByReference) keeps
// its status and schema version only: its operation renders the headers
// and body again on replay.
func responseColumns(r *idem.Response) (storedResponse, error) {
	if r == nil {
		return storedResponse{}, nil
	}
	c := storedResponse{status: &r.Status, schema: nullable(r.SchemaVersion), byReference: r.ByReference}
	if r.ByReference {
		return c, nil
	}
	h, err := encodeHeaders(r.Headers)
	if err != nil {
		return storedResponse{}, err
	}
	c.headers, c.body = h, r.Body
	return c, nil
}

func encodeHeaders(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("store: encode response headers: %w", err)
	}
	s := string(b)
	return &s, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

var _ idem.Coordinator = (*Store)(nil)

// inProgressAgeSQL is InProgressAgeMax's query.
const inProgressAgeSQL = `SELECT COALESCE(EXTRACT(EPOCH FROM now() - (
	SELECT created_at FROM idempotency_records
	WHERE status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY') AND status = 'IN_PROGRESS'
	ORDER BY created_at LIMIT 1)) * 1000, 0)::FLOAT8`

// InProgressAgeMax returns the age, by the store's clock, of the oldest record
// in IN_PROGRESS (0 when there is none). It walks the index of open records
// from its oldest entry (see staleRecords for why an ordered walk).
func InProgressAgeMax(ctx context.Context, q Querier) (time.Duration, error) {
	var ms float64
	err := q.QueryRow(ctx, inProgressAgeSQL).Scan(&ms)
	if err != nil {
		return 0, fmt.Errorf("store: in-progress age: %w", Classify(err))
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// staleRecordsSQL is staleRecords' query.
var staleRecordsSQL = `SELECT ` + recordColumns + ` FROM idempotency_records
	WHERE operation_name = $1 AND status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')
	  AND (locked_until IS NULL OR locked_until < now())
	ORDER BY created_at LIMIT $2`

// staleRecords returns up to limit records of operation that nobody is
// working on: IN_PROGRESS past their lock, or UNKNOWN_REQUIRES_RECOVERY with
// no lock held, whatever their age (an unsettled record is never forgotten).
// Oldest (by creation) first.
//
// It is an ordered walk of idempotency_records_stale, an index of only the
// open records, so that its cost follows the open records, not the table:
// every record enters that index when it is claimed and leaves it when it
// settles, and an index scan marks the entries of settled records dead as it
// passes them, so the next walk skips them. A bitmap scan (what the planner
// chose for the older query, ordered by updated_at, over the index of open
// and retryable records) marks nothing: it visited every record settled since
// the table's last vacuum, which comes after a fifth of the table has
// changed, so each poll cost more the larger the table (424 ms per poll with
// 450,000 records, docs/chaos-history.md "What slowed the 50-minute soak down").
func staleRecords(ctx context.Context, q Querier, operation string, limit int) ([]*idem.Record, error) {
	rows, err := q.Query(ctx, staleRecordsSQL, operation, limit)
	if err != nil {
		return nil, fmt.Errorf("store: stale records: %w", Classify(err))
	}
	defer rows.Close()
	var out []*idem.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("store: scan stale record: %w", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: stale records: %w", Classify(err))
	}
	return out, nil
}

package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Operators settle what recovery cannot (a lost outcome that nobody
// downstream can confirm to recovery): ListRecords finds such records,
// Inspect shows one, and Settle settles one by hand, after a person asked
// downstream what happened. idemctl records and the node's admin API
// (/v1/admin/records) are their front ends.

// Limits of ListRecords and Settle.
const (
	// DefaultListLimit is RecordFilter.Limit's default.
	DefaultListLimit = 100
	// MaxListLimit bounds RecordFilter.Limit.
	MaxListLimit = 1000
	// MaxSettledByLen and MaxSettleReasonLen bound SettleRequest.By and
	// SettleRequest.Reason, in characters.
	MaxSettledByLen    = 256
	MaxSettleReasonLen = 1000
)

// RecordFilter selects the records ListRecords returns; its zero value
// selects every record. Every condition holds at once.
type RecordFilter struct {
	// Tenant, Operation and Status keep the records of that tenant,
	// operation and status ("": any).
	Tenant    string
	Operation string
	Status    idem.Status
	// OlderThan keeps the records created more than this long ago, by the
	// store's clock (0: any age).
	OlderThan time.Duration
	// After is the cursor: only records after this scope in (tenant,
	// operation, key) order, the order of the table's primary key; a page's
	// RecordPage.Next. Nil: from the first.
	After *idem.Scope
	// Limit bounds the page: DefaultListLimit (100) when 0, at most
	// MaxListLimit (1000).
	Limit int
}

// RecordInfo is a record as an operator sees it: everything but the
// stored answer's headers and body (sensitive data), with the body's size
// and who settled it by hand, if anyone did.
type RecordInfo struct {
	// Record is the record; its Response, when it has one, carries the
	// status, schema version and ByReference, never headers or a body.
	Record idem.Record
	// ResponseBytes is the size of the stored body (0 without one).
	ResponseBytes int
	// Settlement is the last settlement by hand of the key while its record
	// exists (nil: none); the record's status may have moved on since (a
	// retry takes a FAILED_RETRYABLE record over).
	Settlement *Settlement
	// StoreTime is the store's clock when the record was read.
	StoreTime time.Time
}

// LockHeld reports whether the record's lock had not run out when it was
// read (by the store's clock): its owner may still be working on it.
func (r *RecordInfo) LockHeld() bool {
	return r.Record.LockedUntil != nil && r.Record.LockedUntil.After(r.StoreTime)
}

// Stuck reports whether the record was stuck when it was read, which is
// what Settle settles: UNKNOWN_REQUIRES_RECOVERY, or IN_PROGRESS whose
// lock has run out (stale), in either case with no lock held.
func (r *RecordInfo) Stuck() bool {
	return openStatus(r.Record.Status) && !r.LockHeld()
}

// Settlement is who settled a record by hand, when (the store's clock) and
// why, and what they settled it as.
type Settlement struct {
	As     idem.Status
	By     string
	At     time.Time
	Reason string
}

// RecordPage is one page of ListRecords.
type RecordPage struct {
	// Records are in (tenant, operation, key) order.
	Records []RecordInfo
	// Next is the cursor of the next page (RecordFilter.After): the last
	// record's scope. Nil on the last page.
	Next *idem.Scope
}

// withoutAnswer is cols (recordColumns) with the stored answer's headers
// and body read as NULL: an operator's view never carries them.
func withoutAnswer(cols string) string {
	parts := strings.Split(cols, ",")
	n := 0
	for i, p := range parts {
		switch strings.TrimSpace(p) {
		case "response_headers":
			parts[i], n = " NULL::JSONB", n+1
		case "response_body":
			parts[i], n = " NULL::BYTEA", n+1
		}
	}
	if n != 2 {
		panic("store: recordColumns has no response_headers or response_body")
	}
	return strings.Join(parts, ",")
}

// infoColumns are what scanInfo scans: the record without its answer, then
// the body's size, the settlement and the store's time.
var infoColumns = withoutAnswer(recordColumns) + `,
	octet_length(response_body), settled_as, settled_by, settled_at, settled_reason, now()`

// scanInfo scans infoColumns.
func scanInfo(row rowScanner) (*RecordInfo, error) {
	var (
		size           pgtype.Int8
		as, by, reason pgtype.Text
		at             pgtype.Timestamptz
		now            time.Time
	)
	rec, err := scanRecord(row, &size, &as, &by, &at, &reason, &now)
	if err != nil {
		return nil, err
	}
	info := &RecordInfo{Record: *rec, ResponseBytes: int(size.Int64), StoreTime: now}
	if as.Valid {
		info.Settlement = &Settlement{As: idem.Status(as.String), By: by.String, At: at.Time, Reason: reason.String}
	}
	return info, nil
}

// ListRecords returns a page of the records f selects, in (tenant,
// operation, key) order. It reads at READ COMMITTED on PostgreSQL (a
// listing needs no serializable snapshot, and a scan at SERIALIZABLE would
// take a predicate lock on every page it reads), as ExecTxReadCommitted.
func (s *Store) ListRecords(ctx context.Context, f RecordFilter) (RecordPage, error) {
	sql, args, limit, err := listSQL(f)
	if err != nil {
		return RecordPage{}, err
	}
	var page RecordPage
	err = s.ExecTxReadCommitted(ctx, func(tx pgx.Tx) error {
		page = RecordPage{}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			info, err := scanInfo(rows)
			if err != nil {
				return err
			}
			page.Records = append(page.Records, *info)
		}
		return rows.Err()
	})
	if err != nil {
		return RecordPage{}, fmt.Errorf("store: list records: %w", Classify(err))
	}
	if len(page.Records) > limit {
		page.Records = page.Records[:limit]
		last := page.Records[limit-1].Record.Scope
		page.Next = &last
	}
	return page, nil
}

// listSQL is ListRecords' query for f (one row more than the page, which
// says whether another page follows), its arguments and the page's size.
// Only the conditions f sets are in it, each a placeholder.
func listSQL(f RecordFilter) (string, []any, int, error) {
	if err := f.validate(); err != nil {
		return "", nil, 0, err
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.Tenant != "" {
		where = append(where, "tenant_id = "+arg(f.Tenant)+"::TEXT")
	}
	if f.Operation != "" {
		where = append(where, "operation_name = "+arg(f.Operation)+"::TEXT")
	}
	if f.Status != "" {
		where = append(where, "status = "+arg(string(f.Status))+"::TEXT")
		if f.Status == idem.StatusInProgress || f.Status == idem.StatusUnknown {
			// The open records' partial index (idempotency_records_stale)
			// holds exactly these: with its predicate written out, a
			// generic plan can walk it instead of every record.
			where = append(where, openStatusPredicate)
		}
	}
	if f.OlderThan > 0 {
		where = append(where, "created_at < now() - "+arg(f.OlderThan.Milliseconds())+"::INT8 * INTERVAL '1 millisecond'")
	}
	if f.After != nil {
		where = append(where, "(tenant_id, operation_name, idempotency_key) > ("+
			arg(f.After.Tenant)+"::TEXT, "+arg(f.After.Operation)+"::TEXT, "+arg(f.After.Key)+"::TEXT)")
	}
	sql := `SELECT ` + infoColumns + ` FROM idempotency_records`
	if len(where) > 0 {
		sql += ` WHERE ` + strings.Join(where, " AND ")
	}
	sql += ` ORDER BY tenant_id, operation_name, idempotency_key LIMIT ` + arg(limit+1) + `::INT8`
	return sql, args, limit, nil
}

// openStatusPredicate is the predicate of idempotency_records_stale
// (migrations/0008_stale_index.sql).
const openStatusPredicate = `status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')`

// validate checks f's fields; errors are REQUEST_VALIDATION_FAILED.
func (f RecordFilter) validate() error {
	switch {
	case f.Tenant != "" && ident.CheckTenant(f.Tenant) != nil:
		return idem.Errorf(idem.ECodeValidationFailed, "A tenant name is 1 to %d characters without white space, ',' or '='.", ident.MaxTenantLen)
	case f.Operation != "" && !idem.ValidOperation(f.Operation):
		return idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-'.", idem.MaxOperationLen)
	case f.Status != "" && !knownStatus(f.Status):
		return idem.Errorf(idem.ECodeValidationFailed, "A status is one of %s.", strings.Join(statusNames(), ", "))
	case f.OlderThan < 0:
		return idem.Errorf(idem.ECodeValidationFailed, "An age must not be negative.")
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return idem.Errorf(idem.ECodeValidationFailed, "A page holds 1 to %d records.", MaxListLimit)
	case f.After != nil && checkScope(*f.After) != nil:
		return idem.Errorf(idem.ECodeValidationFailed, "The cursor does not name a record's scope.")
	}
	return nil
}

// statuses are the record states, in their lifecycle's order.
var statuses = []idem.Status{idem.StatusInProgress, idem.StatusCompleted, idem.StatusFailedReplayable,
	idem.StatusFailedRetryable, idem.StatusUnknown, idem.StatusExpired}

func knownStatus(st idem.Status) bool {
	for _, s := range statuses {
		if s == st {
			return true
		}
	}
	return false
}

func statusNames() []string {
	out := make([]string, len(statuses))
	for i, s := range statuses {
		out[i] = string(s)
	}
	return out
}

// checkScope checks a scope named by an operator: a tenant name, an
// operation name and an idempotency key as the node accepts them.
func checkScope(scope idem.Scope) error {
	switch {
	case ident.CheckTenant(scope.Tenant) != nil:
		return idem.Errorf(idem.ECodeValidationFailed, "A tenant name is 1 to %d characters without white space, ',' or '='.", ident.MaxTenantLen)
	case !idem.ValidOperation(scope.Operation):
		return idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-'.", idem.MaxOperationLen)
	case !idem.ValidKey(scope.Key):
		return idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters, other than \".\" and \"..\".")
	}
	return nil
}

// Inspect returns the record of scope as an operator sees it (RecordInfo),
// or idem.ErrRecordNotFound.
func (s *Store) Inspect(ctx context.Context, scope idem.Scope) (*RecordInfo, error) {
	if err := checkScope(scope); err != nil {
		return nil, err
	}
	var info *RecordInfo
	err := s.Read(ctx, func(q Querier) (err error) {
		info, err = scanInfo(q.QueryRow(ctx, `SELECT `+infoColumns+` FROM idempotency_records
			WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3`, scope.Tenant, scope.Operation, scope.Key))
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, idem.ErrRecordNotFound
	case err != nil:
		return nil, fmt.Errorf("store: inspect record: %w", Classify(err))
	}
	return info, nil
}

// SettleRequest says how to settle a record by hand (Settle).
type SettleRequest struct {
	Scope idem.Scope
	// As is what the record becomes: FAILED_RETRYABLE (downstream did not
	// act: the next retry runs the operation again), COMPLETED (downstream
	// acted; Response is its answer) or FAILED_REPLAYABLE (downstream
	// refused for good; Response is the refusal).
	As idem.Status
	// Response is the answer to store and replay: required with COMPLETED
	// and FAILED_REPLAYABLE (status 100 to 599, headers optional, the body's
	// exact bytes; not ByReference), refused with FAILED_RETRYABLE.
	Response *idem.Response
	// By names who settles it (1 to MaxSettledByLen characters): the
	// person, as the caller authenticated them.
	By string
	// Reason says why (1 to MaxSettleReasonLen characters): who asked whom
	// downstream and what they answered.
	Reason string
}

// ErrNotStuck is what Settle answers for a record that is not stuck:
// settled already, or IN_PROGRESS under a lock that has not run out. Its
// errors carry the same code (IDEMPOTENCY_RECORD_NOT_STUCK) with a message
// saying which; test with errors.Is.
var ErrNotStuck = &idem.Error{Code: idem.ECodeRecordNotStuck,
	Message: "Only an UNKNOWN_REQUIRES_RECOVERY record, or an IN_PROGRESS one whose lock has run out, can be settled."}

// settleAttempts bounds how often Settle reads the record and tries its
// update again when the record changed in between (another owner took it
// over) or the update's commit went unanswered.
const settleAttempts = resolveAttempts

// Settle settles a stuck record by hand (RecordInfo.Stuck: an
// UNKNOWN_REQUIRES_RECOVERY record, or an IN_PROGRESS one whose lock has
// run out), after a person asked downstream what happened. It takes the
// record over as recovery does, with one conditional UPDATE that requires
// the fencing token it read and bumps it, so that a late owner holding the
// old token is fenced (its Checkpoint, Complete or Fail fails with
// idem.ErrFenced), and records By, Reason and the store's time in the
// record (Settlement). As FAILED_RETRYABLE it also puts the checkpoint back
// to RECEIVED, as the engine does when it releases a record, so that the
// next retry runs the operation again (a record at any other checkpoint is
// recovered, never run blindly); as COMPLETED or FAILED_REPLAYABLE it
// stores Response, which every retry then replays.
//
// It refuses a record that is not stuck with an error wrapping ErrNotStuck
// (409 IDEMPOTENCY_RECORD_NOT_STUCK), and an answer for a record that
// references a resource (its operation renders or writes its answer with
// the resource, as payments does) with REQUEST_VALIDATION_FAILED: such a
// record can only be settled as FAILED_RETRYABLE. It returns the record
// as settled, and logs one line (with the key's hash, never the key).
//
// The store's own counter makes the new token; an etcd lock taken later
// for the record (engine.Options.Locker) has a higher revision, as its
// previous lock's deletion was a revision of its own.
func (s *Store) Settle(ctx context.Context, req SettleRequest) (*RecordInfo, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	answer, err := responseColumns(req.Response)
	if err != nil {
		return nil, err
	}
	// unanswered is the token a settle whose commit went unanswered was
	// made under (0: none).
	var unanswered int64
	for attempt := 1; ; attempt++ {
		info, err := s.Inspect(ctx, req.Scope)
		switch {
		case err != nil && unanswered != 0 && !errors.Is(err, idem.ErrRecordNotFound) && attempt <= settleAttempts:
			if perr := pause(ctx, attempt); perr != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, err
		case unanswered != 0 && info.Record.FencingToken == unanswered+1 && req.made(info.Settlement):
			// The unanswered commit happened.
			s.logSettled(ctx, req, info)
			return info, nil
		}
		if err := req.allowedOn(info); err != nil {
			return nil, err
		}
		if attempt > settleAttempts {
			if unanswered != 0 {
				return nil, asUnavailable(fmt.Errorf("store: settle: %w", ErrCommitUnknown))
			}
			return nil, &idem.Error{Code: idem.ECodeInProgress, Message: "The record kept changing hands while it was being settled; look at it again.",
				Err: fmt.Errorf("store: settle: %d attempts", settleAttempts)}
		}
		var settled *RecordInfo
		err = s.ExecOne(ctx, func(q Querier) (err error) {
			settled, err = scanInfo(q.QueryRow(ctx, settleSQL, req.Scope.Tenant, req.Scope.Operation, req.Scope.Key,
				info.Record.FencingToken, string(req.As), "settle/"+req.By, req.By, req.Reason,
				answer.status, answer.headers, answer.body))
			return err
		})
		switch {
		case err == nil:
			s.logSettled(ctx, req, settled)
			return settled, nil
		case errors.Is(err, ErrCommitUnknown):
			unanswered = info.Record.FencingToken
			if perr := pause(ctx, attempt); perr != nil {
				return nil, fmt.Errorf("store: settle: %w", err)
			}
		case errors.Is(err, pgx.ErrNoRows):
			// Taken over, written or locked again since it was read: read
			// it again.
		default:
			return nil, fmt.Errorf("store: settle: %w", Classify(err))
		}
	}
}

// settleSQL takes the record over from the owner whose token ($4) it
// holds, if it is still stuck by the store's clock, and settles it as $5.
var settleSQL = `UPDATE idempotency_records SET
		status = $5::TEXT, owner = $6::TEXT, fencing_token = fencing_token + 1, locked_until = NULL, claim_id = NULL,
		checkpoint = CASE $5::TEXT WHEN 'FAILED_RETRYABLE' THEN 'RECEIVED' WHEN 'COMPLETED' THEN 'COMPLETED' ELSE checkpoint END,
		response_status = $9::INT4, response_headers = $10, response_body = $11,
		response_schema_version = NULL, response_by_reference = false, error_code = NULL, updated_at = now(),
		settled_as = $5::TEXT, settled_by = $7::TEXT, settled_at = now(), settled_reason = $8::TEXT
	WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3 AND fencing_token = $4::INT8
		AND (status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY')) IS TRUE
		AND (locked_until IS NULL OR locked_until <= now())
		AND ($5::TEXT = 'FAILED_RETRYABLE' OR (resource_type IS NULL AND resource_id IS NULL))
	RETURNING ` + infoColumns

// validate checks req's fields.
func (req SettleRequest) validate() error {
	if err := checkScope(req.Scope); err != nil {
		return err
	}
	switch req.As {
	case idem.StatusFailedRetryable:
		if req.Response != nil {
			return idem.Errorf(idem.ECodeValidationFailed, "A record settled as %s stores no answer: its next retry runs the operation again.", req.As)
		}
	case idem.StatusCompleted, idem.StatusFailedReplayable:
		if err := checkAnswer(req.Response); err != nil {
			return err
		}
	default:
		return idem.Errorf(idem.ECodeValidationFailed, "A record is settled as %s, %s or %s.",
			idem.StatusFailedRetryable, idem.StatusCompleted, idem.StatusFailedReplayable)
	}
	if err := checkSettleText("settled by", req.By, MaxSettledByLen); err != nil {
		return err
	}
	return checkSettleText("reason", req.Reason, MaxSettleReasonLen)
}

// checkAnswer checks the answer of a settle as COMPLETED or
// FAILED_REPLAYABLE.
func checkAnswer(r *idem.Response) error {
	switch {
	case r == nil:
		return idem.Errorf(idem.ECodeValidationFailed, "A record settled with an answer needs the answer: its status code and body.")
	case r.Status < 100 || r.Status > 599:
		return idem.Errorf(idem.ECodeValidationFailed, "An answer's status code is 100 to 599.")
	case r.ByReference:
		return idem.Errorf(idem.ECodeValidationFailed, "An answer settled by hand is stored, not rendered from a resource.")
	}
	for k, v := range r.Headers {
		// net/http drops a field whose name is not a token when it
		// writes a replay; a line break or NUL would split one.
		if k == "" || strings.ContainsAny(k, " \t\r\n\x00:") || strings.ContainsAny(v, "\r\n\x00") {
			return idem.Errorf(idem.ECodeValidationFailed, "An answer's header is not a valid HTTP field.")
		}
	}
	return nil
}

// checkSettleText accepts 1 to maxLen characters that package ident
// accepts (NFC, no control or bidirectional control characters).
func checkSettleText(field, v string, maxLen int) error {
	if v == "" || utf8.RuneCountInString(v) > maxLen {
		return idem.Errorf(idem.ECodeValidationFailed, "The %s is 1 to %d characters.", field, maxLen)
	}
	if err := ident.Check(v); err != nil {
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("The %s must be NFC text without control characters.", field), Err: err}
	}
	return nil
}

// allowedOn refuses to settle info's record as req says when it is not
// stuck, or when it references a resource and req stores an answer.
func (req SettleRequest) allowedOn(info *RecordInfo) error {
	rec := &info.Record
	switch {
	case !openStatus(rec.Status):
		return &idem.Error{Code: ErrNotStuck.Code, Message: fmt.Sprintf("The record is %s: settled already. %s", rec.Status, ErrNotStuck.Message)}
	case info.LockHeld():
		return &idem.Error{Code: ErrNotStuck.Code, Message: fmt.Sprintf("The record is %s under a lock held for %s more: its owner may be working on it. %s",
			rec.Status, rec.LockedUntil.Sub(info.StoreTime).Round(time.Millisecond), ErrNotStuck.Message)}
	case req.As != idem.StatusFailedRetryable && (rec.ResourceType != "" || rec.ResourceID != ""):
		return idem.Errorf(idem.ECodeValidationFailed, "The record references a resource its operation writes its answer with; "+
			"settle it as %s, and its next retry runs the operation again.", idem.StatusFailedRetryable)
	}
	return nil
}

// made reports whether s is the settlement req makes.
func (req SettleRequest) made(s *Settlement) bool {
	return s != nil && s.As == req.As && s.By == req.By && s.Reason == req.Reason
}

// logSettled logs a settlement: one line, the key as its hash.
func (s *Store) logSettled(ctx context.Context, req SettleRequest, info *RecordInfo) {
	s.logger.InfoContext(ctx, "record settled by hand",
		"tenant", req.Scope.Tenant, "operation", req.Scope.Operation, "key_hash", telemetry.KeyHash(req.Scope.Key),
		"as", string(req.As), "settled_by", req.By, "reason", req.Reason, "fencing_token", info.Record.FencingToken)
}

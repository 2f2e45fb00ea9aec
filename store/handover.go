package store

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
)

// HandoverConflict is a scope both stores hold with different meanings.
type HandoverConflict struct {
	Scope  idem.Scope
	Reason string
	From   idem.Status
	To     idem.Status
}

// HandoverReport says what Handover did.
type HandoverReport struct {
	Records   int // records read from the old store
	Copied    int // records inserted into the new store
	Identical int // already present with the same request and answer
	Rows      int // the operations' own rows copied (HandoverRows)
	Conflicts []HandoverConflict
}

// HandoverRows copies an operation's own rows of tenant from the store the
// tenant left (from) into its new home's (to), idempotently (a row the new
// store holds is left as it is), and returns how many it copied. Handover
// runs it after it read the records and before it copies them: a
// referencing record renders its answer from a row that committed with it
// or before it, so the new store never holds such a record without its
// row.
type HandoverRows func(ctx context.Context, from, to *Store, tenant string) (int, error)

// Handover merges tenant's records (and, through own, the operations' own
// rows) from the store of the region it left (from) into the store of its
// new home (to), idempotently:
// a record the new store lacks is inserted as is (an open record goes on to
// be recovered there); one it has is compared and reported as a conflict
// when the request hash, state or stored answer differ. Nothing in the new
// store is overwritten. Running it twice copies nothing the second time.
func Handover(ctx context.Context, from, to *Store, tenant string, own ...HandoverRows) (HandoverReport, error) {
	var rep HandoverReport
	// The old region may still be writing (its nodes came back): reads and
	// writes are retried on serialization failures as transactions are.
	var recs []*idem.Record
	err := from.Read(ctx, func(q Querier) error {
		rows, err := q.Query(ctx, `SELECT `+recordColumns+` FROM idempotency_records WHERE tenant_id = $1`, tenant)
		if err != nil {
			return err
		}
		recs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*idem.Record, error) { return scanRecord(row) })
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("store: handover: read records: %w", err)
	}
	rep.Records = len(recs)
	// The operations' rows go first, read after the records: a
	// referencing record renders its answer from its row, which committed
	// with it or before it.
	for _, copyRows := range own {
		n, err := copyRows(ctx, from, to, tenant)
		rep.Rows += n
		if err != nil {
			return rep, fmt.Errorf("store: handover: %w", err)
		}
	}
	for _, rec := range recs {
		var copied bool
		var existing *idem.Record
		err := to.ExecTx(ctx, func(tx pgx.Tx) error {
			copied, existing = false, nil
			ok, err := insertRecord(ctx, tx, rec)
			if err != nil || ok {
				copied = ok
				return err
			}
			existing, err = getTx(ctx, tx, rec.Scope)
			return err
		})
		if err != nil {
			return rep, fmt.Errorf("store: handover %s/%s: %w", rec.Operation, rec.Key, err)
		}
		switch {
		case copied:
			rep.Copied++
		case sameMeaning(rec, existing):
			rep.Identical++
		default:
			rep.Conflicts = append(rep.Conflicts, HandoverConflict{Scope: rec.Scope, Reason: difference(rec, existing), From: rec.Status, To: existing.Status})
		}
	}
	return rep, nil
}

func insertRecord(ctx context.Context, q Querier, r *idem.Record) (bool, error) {
	resp, err := responseColumns(r.Response)
	if err != nil {
		return false, err
	}
	tag, err := q.Exec(ctx, `INSERT INTO idempotency_records (`+recordColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)
		ON CONFLICT DO NOTHING`,
		r.Tenant, r.Operation, r.Key, r.RequestHash, r.HashVersion, string(r.Status), string(r.Checkpoint), r.Owner, r.FencingToken,
		r.LockedUntil, r.Attempts, r.Generation, resp.status, resp.headers, resp.body, resp.schema,
		nullable(r.ResourceType), nullable(r.ResourceID), nullable(r.ErrorCode), r.HomeRegion, r.CreatedAt, r.UpdatedAt, r.ExpiresAt,
		resp.byReference, nullable(r.RawHash))
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func sameMeaning(a, b *idem.Record) bool { return difference(a, b) == "" }

func difference(a, b *idem.Record) string {
	switch {
	case a.RequestHash != b.RequestHash:
		return "different request hash"
	case a.Generation != b.Generation:
		return "different generation"
	case a.Status != b.Status:
		return "different state"
	case (a.Response == nil) != (b.Response == nil):
		return "only one store has an answer"
	case a.Response != nil && (a.Response.Status != b.Response.Status || a.Response.ByReference != b.Response.ByReference ||
		!bytes.Equal(a.Response.Body, b.Response.Body)):
		return "different stored answer"
	case a.ResourceID != b.ResourceID:
		return "different resource"
	}
	return ""
}

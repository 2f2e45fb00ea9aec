package store

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	Payments  int // payment rows copied
	Conflicts []HandoverConflict
}

// Handover merges tenant's records (and payment rows) from the store of the
// region it left (from) into the store of its new home (to), idempotently:
// a record the new store lacks is inserted as is (an open record goes on to
// be recovered there); one it has is compared and reported as a conflict
// when the request hash, state or stored answer differ. Nothing in the new
// store is overwritten. Running it twice copies nothing the second time.
func Handover(ctx context.Context, from, to *Store, tenant string) (HandoverReport, error) {
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
	// Payments go first, read after the records: a referencing record
	// renders its answer from its payment, which committed with it or
	// before it, so the new store never holds such a record without it.
	n, err := copyPayments(ctx, from, to, tenant)
	rep.Payments = n
	if err != nil {
		return rep, err
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
			existing, err = GetTx(ctx, tx, rec.Scope)
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
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)
		ON CONFLICT DO NOTHING`,
		r.Tenant, r.Operation, r.Key, r.RequestHash, r.HashVersion, string(r.Status), string(r.Checkpoint), r.Owner, r.FencingToken,
		r.LockedUntil, r.Attempts, r.Generation, resp.status, resp.headers, resp.body, resp.schema,
		nullable(r.ResourceType), nullable(r.ResourceID), nullable(r.ErrorCode), r.HomeRegion, r.CreatedAt, r.UpdatedAt, r.ExpiresAt,
		resp.byReference)
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

// paymentRow, paymentColumns and scanPayment are the payments table's row
// as the handover copies it.
type paymentRow struct {
	Tenant, ID, AccountID                                     string
	AmountMinor                                               int64
	Currency, MerchantReference, Channel, Status, ProviderKey string
	CreatedAt                                                 time.Time
}

const paymentColumns = `tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference, channel, status, provider_key, created_at`

func scanPayment(row rowScanner) (paymentRow, error) {
	var p paymentRow
	err := row.Scan(&p.Tenant, &p.ID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.MerchantReference, &p.Channel, &p.Status, &p.ProviderKey, &p.CreatedAt)
	return p, err
}

func copyPayments(ctx context.Context, from, to *Store, tenant string) (int, error) {
	var pays []paymentRow
	err := from.Read(ctx, func(q Querier) error {
		rows, err := q.Query(ctx, `SELECT `+paymentColumns+` FROM payments WHERE tenant_id = $1`, tenant)
		if err != nil {
			return err
		}
		pays, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (paymentRow, error) { return scanPayment(row) })
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: handover: read payments: %w", err)
	}
	copied := 0
	for _, p := range pays {
		var tag pgconn.CommandTag
		err := to.ExecOne(ctx, func(q Querier) error {
			var err error
			tag, err = q.Exec(ctx, `INSERT INTO payments (`+paymentColumns+`, updated_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now()) ON CONFLICT DO NOTHING`,
				p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey, p.CreatedAt)
			return err
		})
		if err != nil {
			return copied, fmt.Errorf("store: handover: copy payment %s: %w", p.ID, err)
		}
		copied += int(tag.RowsAffected())
	}
	return copied, nil
}

package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/store"
)

// The payments operation's own rows: the payments table and the outbox
// events written with them (migrations in migrations/). The store knows
// nothing of them; payments writes them with its SQL through store.Querier,
// in the claim's statement (store.ClaimWith) or under a claim it holds.

// Payment is a row of the payments table.
type Payment struct {
	Tenant            string
	ID                string
	AccountID         string
	AmountMinor       int64
	Currency          string
	MerchantReference string
	Channel           string
	Status            string
	ProviderKey       string
	CreatedAt         time.Time
}

// Event is an outbox event, written in the same transaction as the payment
// it describes.
type Event struct {
	ID          string
	Tenant      string
	AggregateID string
	Type        string
	Payload     json.RawMessage
}

// ErrDuplicateMerchantReference is returned (wrapped) when a payment violates
// unique(tenant, account, merchant reference).
var ErrDuplicateMerchantReference = errors.New("payments: duplicate merchant reference")

// ErrPaymentNotFound: no such payment, answered as PAYMENT_NOT_FOUND.
var ErrPaymentNotFound = errors.New("payments: payment not found")

// ResourceType is the resource type of the records payments writes.
const ResourceType = "payment"

// paymentColumns are the payments table's columns Payment holds.
var paymentColumns = []string{"tenant_id", "payment_id", "account_id", "amount_minor", "currency",
	"merchant_reference", "channel", "status", "provider_key", "created_at"}

const paymentColumnList = `tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference, channel, status, provider_key, created_at`

// paymentWrites are the writes of create_payment's claim statements
// after the record: the payment row, only if the claim inserted the
// record.
const paymentWrites = `, pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now() FROM claim
		RETURNING payment_id
	)`

// eventWrite is the payment's outbox event, only if the payment was
// written.
const eventWrite = `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $10, $1, payment_id, $11, $12, now() FROM pay
	RETURNING now()`

// claimWithPayment is the single-statement fast path of create_payment:
// the record, and only if it was inserted, the payment row and its outbox
// event, in one round trip.
var claimWithPayment = store.NewClaimWith(paymentWrites+"\n\t"+eventWrite, 12)

// claimOrReplayPayment is claimWithPayment that, when the key is taken,
// reads the record that holds it and the payment it references in the same
// round trip (store.ClaimOrReadWith).
var claimOrReplayPayment = store.NewClaimOrReadWith(paymentWrites+`,
	written AS (`+eventWrite+` AS at)`, 12, ResourceType,
	`SELECT * FROM payments WHERE tenant_id = $1 AND payment_id = r.resource_id`, paymentColumns...)

// claimOrReplayBatch is claimOrReplayPayment's batch form
// (store.NewClaimOrReadGroup): the payments and events of the keys a batch
// claimed, each payment in the order of its id, so that two batches that
// wait on each other's payments cannot wait in a cycle.
const claimOrReplayBatch = `, pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT a1, a2, a3, a4, a5, a6, a7, a8, a9, now(), now() FROM claimed ORDER BY a1, a2
		RETURNING tenant_id, payment_id
	),
	written AS (INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
		SELECT c.a10, c.a1, c.a2, c.a11, c.a12, now() FROM claimed c JOIN pay p ON p.tenant_id = c.a1 AND p.payment_id = c.a2
		RETURNING 1)`

// claimOrReplayBatchTypes are the SQL types of claimOrReplayPayment's
// arguments.
var claimOrReplayBatchTypes = []string{"TEXT", "TEXT", "TEXT", "INT8", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "JSONB"}

// newClaimGroup is the group commit of claimOrReplayPayment on st.
func newClaimGroup(st *store.Store) *store.ClaimOrReadGroup {
	return st.NewClaimOrReadGroup(claimOrReplayPayment, claimOrReplayBatch, claimOrReplayBatchTypes, ResourceType,
		`SELECT * FROM payments WHERE tenant_id = r.tenant_id AND payment_id = r.resource_id`, paymentColumns...)
}

// ClaimWithPayment claims req's key and writes payment p and its event ev
// in one statement (store.ClaimWith): the record in state status at
// checkpoint cp (with completion's answer when it is not nil), and only if
// the record was inserted, the payment and the event. It reports whether
// this call inserted the claim, and the statement's time (the payment's
// created_at) when it did. A merchant-reference violation returns
// ErrDuplicateMerchantReference and writes nothing.
func ClaimWithPayment(ctx context.Context, q store.Querier, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, p Payment, ev Event) (inserted bool, at time.Time, err error) {
	inserted, at, err = claimWithPayment.Exec(ctx, q, req, status, cp, completion, ResourceType, p.ID,
		req.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, string(ev.Payload))
	if err != nil {
		return false, time.Time{}, classify(err)
	}
	return inserted, at, nil
}

// settledWithPayment is the replay fast path's read joined with the
// payment a referencing record renders its answer from.
var settledWithPayment = store.NewReferenceRead(ResourceType,
	`SELECT * FROM payments WHERE tenant_id = $1 AND payment_id = r.resource_id`, paymentColumns...)

// referencedPayment receives the payment columns a read of a referencing
// record joins (all NULL when it references none). Value types, not
// pointers: pgx scans a NULL into a **T through a reflect-built plan and a
// new value per column and row, which a replay paid ten times over.
type referencedPayment struct {
	tenant, id, account, currency, ref, ch, status, providerKey pgtype.Text
	amount                                                      pgtype.Int8
	created                                                     pgtype.Timestamptz
}

// dest are the scan destinations, in paymentColumns' order.
func (r *referencedPayment) dest() []any {
	return []any{&r.tenant, &r.id, &r.account, &r.amount, &r.currency, &r.ref, &r.ch, &r.status, &r.providerKey, &r.created}
}

// payment is the row read, or nil.
func (r *referencedPayment) payment(tenant string) *Payment {
	if !r.id.Valid {
		return nil
	}
	return &Payment{Tenant: tenant, ID: r.id.String, AccountID: r.account.String, AmountMinor: r.amount.Int64, Currency: r.currency.String,
		MerchantReference: r.ref.String, Channel: r.ch.String, Status: r.status.String, ProviderKey: r.providerKey.String, CreatedAt: r.created.Time}
}

// readSettled is store.ReadSettled for create_payment, with the payment a
// referencing record (idem.Response.ByReference) renders its answer from,
// read in the same round trip. The payment is nil when the record
// references none (or the row is gone).
func readSettled(ctx context.Context, st *store.Store, req idem.BeginRequest) (idem.Decision, *Payment, bool, error) {
	var ref referencedPayment
	d, ok, err := st.ReadSettledWith(ctx, req, settledWithPayment, ref.dest()...)
	if err != nil || !ok {
		return d, nil, ok, err
	}
	return d, ref.payment(req.Tenant), true, nil
}

// claimOrReplay is ClaimWithPayment through claimOrReplayPayment, as a
// statement of its own or in a batch with concurrent claims (g): when the
// key is taken by a settled record, its decision and the payment it
// references (settled; p may be nil) instead of nothing. Without read, a
// claim sent alone reads nothing (store.ClaimOrReadGroup.ExecExpectFree).
func claimOrReplay(ctx context.Context, g *store.ClaimOrReadGroup, read bool, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, p Payment, ev Event) (store.ClaimOrRead, *Payment, error) {
	var ref referencedPayment
	exec := g.Exec
	if !read {
		exec = g.ExecExpectFree
	}
	out, err := exec(ctx, req, status, cp, completion, ResourceType, p.ID, []any{
		req.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, string(ev.Payload)}, ref.dest()...)
	if err != nil {
		return store.ClaimOrRead{}, nil, classify(err)
	}
	return out, ref.payment(req.Tenant), nil
}

// InsertPayment writes a payment row and its outbox event for an owner that
// already holds the claim (a recovery or a reuse after the window). A payment
// that already exists with the same id is left as it is (an earlier owner of
// the same operation wrote it).
func InsertPayment(ctx context.Context, q store.Querier, p Payment, ev Event) error {
	return writePayment(ctx, q, insertPaymentSQL, p, ev)
}

// InsertPaymentOnly is the business write without any idempotency record: the
// payment row and its outbox event in one statement, the same SQL as the
// claimed path otherwise. It is the baseline that benchmarks compare against.
func InsertPaymentOnly(ctx context.Context, q store.Querier, p Payment, ev Event) error {
	return writePayment(ctx, q, insertPaymentOnlySQL, p, ev)
}

// paymentWriteSQL is a payment row and its outbox event in one statement;
// onConflict goes after the payment's VALUES.
func paymentWriteSQL(onConflict string) string {
	return `WITH pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now())` + onConflict + `
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $10, $1, payment_id, $11, $12, now() FROM pay`
}

var (
	insertPaymentSQL     = paymentWriteSQL("\n\t\tON CONFLICT (tenant_id, payment_id) DO NOTHING")
	insertPaymentOnlySQL = paymentWriteSQL("")
)

// writePayment runs one of the payment write statements.
func writePayment(ctx context.Context, q store.Querier, sql string, p Payment, ev Event) error {
	_, err := q.Exec(ctx, sql,
		p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, string(ev.Payload))
	if err != nil {
		return classify(err)
	}
	return nil
}

// classify marks a unique violation of the payments table as
// ErrDuplicateMerchantReference. The payment id derives from the same
// business identity as the merchant-reference constraint, so either index
// may report it.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" &&
		(pgErr.ConstraintName == "payments_merchant_reference_key" || pgErr.ConstraintName == "payments_pkey") {
		return fmt.Errorf("%w: %w", ErrDuplicateMerchantReference, err)
	}
	return err
}

type rowScanner interface{ Scan(dest ...any) error }

func scanPayment(row rowScanner) (Payment, error) {
	var p Payment
	err := row.Scan(&p.Tenant, &p.ID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.MerchantReference, &p.Channel, &p.Status, &p.ProviderKey, &p.CreatedAt)
	return p, err
}

// GetPayment returns the tenant's payment id, or ErrPaymentNotFound.
func GetPayment(ctx context.Context, q store.Querier, tenant, id string) (Payment, error) {
	p, err := scanPayment(q.QueryRow(ctx, `SELECT `+paymentColumnList+` FROM payments WHERE tenant_id = $1 AND payment_id = $2`, tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("payments: get payment: %w", store.Classify(err))
	}
	return p, nil
}

// PaymentByMerchantReference returns the tenant's payment for an account and
// merchant reference, or ErrPaymentNotFound.
func PaymentByMerchantReference(ctx context.Context, q store.Querier, tenant, account, ref string) (Payment, error) {
	p, err := scanPayment(q.QueryRow(ctx, `SELECT `+paymentColumnList+` FROM payments
		WHERE tenant_id = $1 AND account_id = $2 AND merchant_reference = $3`, tenant, account, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("payments: payment by merchant reference: %w", store.Classify(err))
	}
	return p, nil
}

// SetPaymentStatus updates a payment's status (for example PENDING ->
// CONFIRMED) and writes its outbox event, in the caller's transaction.
func SetPaymentStatus(ctx context.Context, q store.Querier, tenant, id, status string, ev *Event) error {
	if _, err := q.Exec(ctx, `UPDATE payments SET status = $3, updated_at = now() WHERE tenant_id = $1 AND payment_id = $2`, tenant, id, status); err != nil {
		return fmt.Errorf("payments: set payment status: %w", err)
	}
	if ev == nil {
		return nil
	}
	if _, err := q.Exec(ctx, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
		VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (event_id) DO NOTHING`, ev.ID, ev.Tenant, ev.AggregateID, ev.Type, string(ev.Payload)); err != nil {
		return fmt.Errorf("payments: write outbox event: %w", err)
	}
	return nil
}

// HandoverRows copies tenant's payments from the store it left into its new
// home's (a store.HandoverRows, which failover.Handover passes to
// store.Handover): a referencing record renders its answer from its
// payment. A payment the new store holds is left as it is.
func HandoverRows(ctx context.Context, from, to *store.Store, tenant string) (int, error) {
	var pays []Payment
	err := from.Read(ctx, func(q store.Querier) error {
		rows, err := q.Query(ctx, `SELECT `+paymentColumnList+` FROM payments WHERE tenant_id = $1`, tenant)
		if err != nil {
			return err
		}
		pays, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Payment, error) { return scanPayment(row) })
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("payments: read payments: %w", err)
	}
	copied := 0
	for _, p := range pays {
		var tag pgconn.CommandTag
		err := to.ExecOne(ctx, func(q store.Querier) error {
			var err error
			tag, err = q.Exec(ctx, `INSERT INTO payments (`+paymentColumnList+`, updated_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now()) ON CONFLICT DO NOTHING`,
				p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey, p.CreatedAt)
			return err
		})
		if err != nil {
			return copied, fmt.Errorf("payments: copy payment %s: %w", p.ID, err)
		}
		copied += int(tag.RowsAffected())
	}
	return copied, nil
}

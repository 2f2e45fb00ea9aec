package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Payment is a row of the reference domain's payments table.
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

// Event is an outbox event, written in the same transaction as the business
// row it describes.
type Event struct {
	ID          string
	Tenant      string
	AggregateID string
	Type        string
	Payload     json.RawMessage
}

// ErrDuplicateMerchantReference is returned (wrapped) when a payment violates
// unique(tenant, account, merchant reference).
var ErrDuplicateMerchantReference = errors.New("store: duplicate merchant reference")

// ClaimWithPayment is the single-statement fast path of create_payment: it
// inserts the idempotency record (insert first: ON CONFLICT DO NOTHING), and
// only if that insert happened, the payment row and its outbox event, all in
// one round trip. The record is written in state status/checkpoint; when
// completion is non-nil its response is stored with it (status COMPLETED).
//
// It reports whether this call inserted the claim, and the transaction's
// time (the payment's created_at when it did). When it did not, nothing
// was written and the caller decides from the existing record
// (DecideExisting). A merchant-reference violation returns
// ErrDuplicateMerchantReference and writes nothing. Being one statement,
// it may run as an implicit transaction of its own (Store.ExecOne).
func ClaimWithPayment(ctx context.Context, q Querier, req idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion, p Payment, ev Event) (inserted bool, at time.Time, err error) {
	ctx, span := telemetry.Start(ctx, "idem.claim", trace.SpanKindInternal)
	defer span.End()
	var resp *idem.Response
	if completion != nil {
		resp = &completion.Response
	}
	r, err := responseColumns(resp)
	if err != nil {
		return false, time.Time{}, err
	}
	err = q.QueryRow(ctx, `WITH claim AS (
		INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
			 owner, fencing_token, locked_until, home_region, created_at, updated_at, expires_at,
			 response_status, response_headers, response_body, response_schema_version, response_by_reference,
			 resource_type, resource_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1,
			CASE WHEN $6 = 'IN_PROGRESS' THEN now() + $9::INT8 * INTERVAL '1 millisecond' END,
			$10, now(), now(), now() + $11::INT8 * INTERVAL '1 millisecond',
			$12, $13, $14, $15, $27, 'payment', $16)
		ON CONFLICT DO NOTHING
		RETURNING 1 AS n
	), pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT $1, $16, $17, $18, $19, $20, $21, $22, $23, now(), now() FROM claim
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $24, $1, payment_id, $25, $26, now() FROM pay
	RETURNING now()`,
		req.Tenant, req.Operation, req.Key, req.RequestHashes[0], req.HashVersion, string(status), string(cp),
		req.Owner, req.LockFor.Milliseconds(), req.HomeRegion, req.Window.Milliseconds(),
		r.status, r.headers, r.body, r.schema, p.ID,
		p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, []byte(ev.Payload), r.byReference,
	).Scan(&at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The key has a record: the claim inserted nothing, so neither
		// did the payment and event that follow from it.
		return false, time.Time{}, nil
	case err != nil:
		return false, time.Time{}, classifyPaymentErr(err)
	}
	return true, at, nil
}

// settledPaymentSQL is ReadSettledTx's read joined with the payment a
// referencing record renders its answer from. The payment is a LATERAL
// subquery keyed on both columns of its primary key, so that its lookup is
// one index probe whatever the planner believes of the tables' sizes: as a
// plain join, a generic plan made while the tables were small scanned
// every payment of the tenant for each read.
var settledPaymentSQL = `SELECT ` + qualified("r.", recordColumns) + `, now(),
	p.payment_id, p.account_id, p.amount_minor, p.currency, p.merchant_reference, p.channel, p.status, p.provider_key, p.created_at
	FROM idempotency_records r LEFT JOIN LATERAL (
		SELECT * FROM payments WHERE tenant_id = $1 AND payment_id = r.resource_id
		  AND r.response_by_reference AND r.resource_type = 'payment'
		LIMIT 1) p ON true
	WHERE r.tenant_id = $1 AND r.operation_name = $2 AND r.idempotency_key = $3
	AND r.status IN ` + settledStatuses + ` AND r.expires_at > now()`

// qualified prefixes each column of a comma-separated list.
func qualified(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// ReadSettledPayment is ReadSettled for create_payment: the same one read
// of a settled record, joined with the payment a referencing record
// (idem.Response.ByReference) renders its answer from, so that a replay of
// such a record costs one round trip too. The payment is nil when the
// record references none (or the row is gone).
func (s *Store) ReadSettledPayment(ctx context.Context, req idem.BeginRequest) (idem.Decision, *Payment, bool, error) {
	if !s.replayRead || len(req.RequestHashes) == 0 {
		return idem.Decision{}, nil, false, nil
	}
	var (
		now                            time.Time
		id, account, currency, ref, ch *string
		status, providerKey            *string
		amount                         *int64
		created                        *time.Time
	)
	rec, err := scanRecord(s.pool.QueryRow(ctx, settledPaymentSQL, req.Tenant, req.Operation, req.Key),
		&now, &id, &account, &amount, &currency, &ref, &ch, &status, &providerKey, &created)
	d, ok, err := settledDecision(rec, err, req, now)
	if err != nil {
		return idem.Decision{}, nil, false, settledReadError(err)
	}
	if !ok || id == nil {
		return d, nil, ok, nil
	}
	return d, &Payment{Tenant: req.Tenant, ID: *id, AccountID: *account, AmountMinor: *amount, Currency: *currency,
		MerchantReference: *ref, Channel: *ch, Status: *status, ProviderKey: *providerKey, CreatedAt: *created}, true, nil
}

// InsertPayment writes a payment row and its outbox event for an owner that
// already holds the claim (a recovery or a reuse after the window). A payment
// that already exists with the same id is left as it is (an earlier owner of
// the same operation wrote it).
func InsertPayment(ctx context.Context, q Querier, p Payment, ev Event) error {
	_, err := q.Exec(ctx, `WITH pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now())
		ON CONFLICT (tenant_id, payment_id) DO NOTHING
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $10, $1, payment_id, $11, $12, now() FROM pay`,
		p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, []byte(ev.Payload))
	if err != nil {
		return classifyPaymentErr(err)
	}
	return nil
}

// InsertPaymentOnly is the business write without any idempotency record: the
// payment row and its outbox event in one statement, the same SQL as the
// claimed path otherwise. It is the baseline that benchmarks compare against.
func InsertPaymentOnly(ctx context.Context, q Querier, p Payment, ev Event) error {
	_, err := q.Exec(ctx, `WITH pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now())
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $10, $1, payment_id, $11, $12, now() FROM pay`,
		p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference, p.Channel, p.Status, p.ProviderKey,
		ev.ID, ev.Type, []byte(ev.Payload))
	if err != nil {
		return classifyPaymentErr(err)
	}
	return nil
}

func classifyPaymentErr(err error) error {
	var pgErr *pgconn.PgError
	// The payment id derives from the same business identity as the
	// merchant-reference constraint, so either index may report it.
	if errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation &&
		(pgErr.ConstraintName == "payments_merchant_reference_key" || pgErr.ConstraintName == "payments_pkey") {
		return fmt.Errorf("%w: %w", ErrDuplicateMerchantReference, err)
	}
	return err
}

const paymentColumns = `tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference, channel, status, provider_key, created_at`

func scanPayment(row rowScanner) (Payment, error) {
	var p Payment
	err := row.Scan(&p.Tenant, &p.ID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.MerchantReference, &p.Channel, &p.Status, &p.ProviderKey, &p.CreatedAt)
	return p, err
}

// ErrPaymentNotFound: no such payment. Package payments answers it as its
// PAYMENT_NOT_FOUND code.
var ErrPaymentNotFound = errors.New("store: payment not found")

// GetPayment returns the tenant's payment id, or ErrPaymentNotFound.
func GetPayment(ctx context.Context, q Querier, tenant, id string) (Payment, error) {
	p, err := scanPayment(q.QueryRow(ctx, `SELECT `+paymentColumns+` FROM payments WHERE tenant_id = $1 AND payment_id = $2`, tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("store: get payment: %w", unavailableOr(err))
	}
	return p, nil
}

// PaymentByMerchantReference returns the tenant's payment for an account and
// merchant reference, or ErrPaymentNotFound.
func PaymentByMerchantReference(ctx context.Context, q Querier, tenant, account, ref string) (Payment, error) {
	p, err := scanPayment(q.QueryRow(ctx, `SELECT `+paymentColumns+` FROM payments
		WHERE tenant_id = $1 AND account_id = $2 AND merchant_reference = $3`, tenant, account, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("store: payment by merchant reference: %w", unavailableOr(err))
	}
	return p, nil
}

// SetPaymentStatus updates a payment's status (for example PENDING ->
// CONFIRMED) and writes its outbox event, in the caller's transaction.
func SetPaymentStatus(ctx context.Context, q Querier, tenant, id, status string, ev *Event) error {
	if _, err := q.Exec(ctx, `UPDATE payments SET status = $3, updated_at = now() WHERE tenant_id = $1 AND payment_id = $2`, tenant, id, status); err != nil {
		return fmt.Errorf("store: set payment status: %w", err)
	}
	if ev == nil {
		return nil
	}
	if _, err := q.Exec(ctx, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
		VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (event_id) DO NOTHING`, ev.ID, ev.Tenant, ev.AggregateID, ev.Type, []byte(ev.Payload)); err != nil {
		return fmt.Errorf("store: write outbox event: %w", err)
	}
	return nil
}

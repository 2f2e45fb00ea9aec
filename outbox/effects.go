package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemcoord/idem/store"
)

// EffectGuard decides, in a database every region sees, which region
// produces a consumer effect. After a region failover with region-local
// stores, a payment the old home recorded is recorded again in its new home
// under the same derived payment id, and its events are emitted again there;
// each region's inbox then dedupes only its own deliveries. The guard keys
// each effect by an id derived from the payment's business identity (the
// ledger entry id, the receipt's dedupe key, which derive from the payment
// id) and lets the first region that claims it produce it: every other
// region marks its delivery processed with no effect.
//
// A claim is insert-first (INSERT ... ON CONFLICT DO NOTHING) on
// effect_claims(effect_key); the claiming region may claim again (its own
// redelivery, or a batch retried after a failure), so a region that claimed
// an effect and failed before committing it produces it on its next batch.
// In global store mode the store itself is such a database
// ([NewEffectGuard] on the store's pool).
type EffectGuard struct {
	pool   *pgxpool.Pool
	region string
}

// effectClaimsDDL creates the guard's table (the same as payments'
// migration 0005_effect_claims.sql).
const effectClaimsDDL = `CREATE TABLE IF NOT EXISTS effect_claims (
	effect_key TEXT        NOT NULL PRIMARY KEY,
	region     TEXT        NOT NULL,
	claimed_at TIMESTAMPTZ NOT NULL DEFAULT now())`

// NewEffectGuard returns a guard for region over pool (which the caller
// closes). It creates the guard's table only when it is missing: a store
// migrated by payments.Migrate has it (so a node whose role may not run
// DDL can use the store), a dedicated effects database gets it here.
func NewEffectGuard(ctx context.Context, pool *pgxpool.Pool, region string) (*EffectGuard, error) {
	if region == "" {
		return nil, errors.New("outbox: effect guard: a region is required")
	}
	exists := func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT to_regclass('effect_claims') IS NOT NULL`).Scan(&ok)
		return ok, err
	}
	ok, err := exists()
	if err != nil {
		return nil, fmt.Errorf("outbox: effect guard: %w", store.Classify(err))
	}
	if !ok {
		if _, err := pool.Exec(ctx, effectClaimsDDL); err != nil {
			// Concurrent CREATE TABLE IF NOT EXISTS can race in
			// PostgreSQL's catalog; a node that lost the race finds the
			// table there.
			if ok, qerr := exists(); qerr != nil || !ok {
				return nil, fmt.Errorf("outbox: effect guard: create effect_claims: %w", store.Classify(err))
			}
		}
	}
	return &EffectGuard{pool: pool, region: region}, nil
}

// Claim reports whether this guard's region produces the effect named key:
// it does when it claims it first, or claimed it before.
func (g *EffectGuard) Claim(ctx context.Context, key string) (bool, error) {
	var owner string
	err := g.pool.QueryRow(ctx, `INSERT INTO effect_claims (effect_key, region) VALUES ($1, $2)
		ON CONFLICT (effect_key) DO NOTHING RETURNING region`, key, g.region).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		err = g.pool.QueryRow(ctx, `SELECT region FROM effect_claims WHERE effect_key = $1`, key).Scan(&owner)
	}
	if err != nil {
		return false, fmt.Errorf("outbox: claim effect %s: %w", key, store.Classify(err))
	}
	return owner == g.region, nil
}

// WithEffectGuard makes the built-in consumers (ledger, receipt email) claim
// each effect through g before producing it (see EffectGuard). A claim that
// fails leaves the delivery pending for a later batch.
func WithEffectGuard(g *EffectGuard) ConsumerOption {
	return func(c *Consumers) {
		if g == nil {
			return
		}
		c.handlers[ConsumerLedger] = guarded(g, ledgerEffectKey, HandleLedger)
		c.handlers[ConsumerReceiptEmail] = guarded(g, receiptEffectKey, HandleReceiptEmail)
	}
}

// guarded runs h only for the effects g grants this region; a message whose
// key cannot be derived goes to h, which rejects it.
func guarded(g *EffectGuard, key func(Message) (string, bool), h Handler) Handler {
	return func(ctx context.Context, q store.Querier, m Message) error {
		k, ok := key(m)
		if !ok {
			return h(ctx, q, m)
		}
		mine, err := g.Claim(ctx, k)
		if err != nil {
			return err
		}
		if !mine {
			return nil // produced by the region that claimed it first
		}
		return h(ctx, q, m)
	}
}

// ledgerEffectKey is the effect key of a ledger event: tenant and entry id.
func ledgerEffectKey(m Message) (string, bool) {
	ev, err := decodePaymentEvent(m)
	if err != nil {
		return "", false
	}
	switch m.Type {
	case EventPaymentCreated:
		return "ledger/" + m.Tenant + "/" + ledgerEntryID(EntryPaymentCreated, ev.PaymentID), true
	case EventPaymentConfirmed:
		return "ledger/" + m.Tenant + "/" + ledgerEntryID(EntryPaymentConfirmed, ev.PaymentID), true
	}
	return "", false
}

// receiptEffectKey is the effect key of a receipt: tenant and dedupe key.
func receiptEffectKey(m Message) (string, bool) {
	ev, err := decodePaymentEvent(m)
	if err != nil || m.Type != EventPaymentConfirmed {
		return "", false
	}
	return "email/" + m.Tenant + "/" + receiptDedupeKey(ev.PaymentID), true
}

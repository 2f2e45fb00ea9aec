package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// Operation names of the store and replay suites.
const (
	OpBaseline             = "baseline"
	OpBaselineSequential   = "baseline sequential ids"
	OpBaselineRecord       = "baseline and its record"
	OpBaselineKey          = "baseline and its key"
	OpIdempotent           = "idempotent"
	OpIdempotentClaimFirst = "idempotent claim-first"
	OpIdempotentStoredBody = "idempotent stored-body"
	OpIdempotentReadFirst  = "idempotent read-first"
	OpWrite                = "write"
	OpReplay               = "replay"
	OpReplayClaimFirst     = "replay claim-first"
	OpReplayStoredBody     = "replay stored-body"
	OpReplayInClaim        = "replay in the claim"
	OpReplayFromMemory     = "replay from memory"
)

// storedBodies is the service configuration of the stored-body phases:
// records that keep the 201 answer instead of a reference to the payment
// (payments.Config.StoreBodies), side by side with the referencing
// records the product writes by default.
var storedBodies = payments.Config{Region: "bench", StoreBodies: true}

// writer issues fresh operations with unique bodies and keys.
type writer struct {
	run        string
	tenant     string
	sequential bool
	seq        atomic.Int64
}

func newWriter(suite string, cfg Config) *writer {
	run := runID()
	return &writer{run: run, tenant: "bench-" + suite + "-" + run, sequential: cfg.Keys == KeysSequential}
}

// key is the idempotency key of the writer's nth request of a kind
// (prefix): "key-<run>-<prefix>-<n>" with sequential keys, else 32 hex
// digits spread as random (UUID v4) keys are.
func (w *writer) key(prefix string, n int64) string {
	k := fmt.Sprintf("key-%s-%s-%d", w.run, prefix, n)
	if w.sequential {
		return k
	}
	return scaleKey(k, n)
}

// baseline is the business write without the layer: parse and validate the
// command, then the payment row and its outbox event in one statement, sent
// as a SERIALIZABLE transaction of its own in one round trip (store.Store.ExecOne),
// as the layer sends its claim of a fresh key. The payment is the one the
// layer writes for the same command (payments.PaymentID: an id spread over
// the key space as a hash), so that the two differ by the layer's writes
// alone.
func (w *writer) baseline(st *store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		_, err := baselineWrite(ctx, st, w.tenant, "", body(w.run, n))
		return err
	}
}

// baselineSequential is baseline with payment ids numbered in order
// ("pay_base_<run>_<n>"), as the suite's baseline wrote them before: each
// insert lands at the right edge of the payments' and events' primary
// keys, where the layer's ids (hashes) and keys (random) land anywhere.
// It shows what the ids' order alone is worth.
func (w *writer) baselineSequential(st *store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		_, err := baselineWrite(ctx, st, w.tenant, fmt.Sprintf("pay_base_%s_%d", w.run, n), body(w.run, n))
		return err
	}
}

// baselineWrite parses body and writes its payment and event under id, or
// when id is empty, under the id the layer gives the same command
// (payments.PaymentID).
func baselineWrite(ctx context.Context, st *store.Store, tenant, id string, b []byte) (payments.Payment, error) {
	p, ev, err := baselinePayment(tenant, id, b)
	if err != nil {
		return payments.Payment{}, err
	}
	return p, st.ExecOne(ctx, func(q store.Querier) error { return payments.InsertPaymentOnly(ctx, q, p, ev) })
}

// baselinePayment parses body into the payment and event the baseline
// writes under id (payments.PaymentID when id is empty).
func baselinePayment(tenant, id string, b []byte) (payments.Payment, payments.Event, error) {
	cmd, err := payments.ParseCommand(b, "")
	if err != nil {
		return payments.Payment{}, payments.Event{}, err
	}
	if id == "" {
		id = payments.PaymentID(tenant, cmd.AccountID, cmd.MerchantReference)
	}
	p := payments.Payment{Tenant: tenant, ID: id, AccountID: cmd.AccountID,
		AmountMinor: cmd.AmountMinor, Currency: cmd.Currency, MerchantReference: cmd.MerchantReference,
		Channel: cmd.Channel, Status: "PENDING"}
	p.ProviderKey = payments.ProviderKey(p.ID)
	payload, err := json.Marshal(map[string]string{"eventId": "evt_" + p.ID + "_created", "type": "PaymentCreated",
		"paymentId": p.ID, "accountId": p.AccountID, "amount": cmd.Amount(), "currency": p.Currency})
	if err != nil {
		return payments.Payment{}, payments.Event{}, err
	}
	ev := payments.Event{ID: "evt_" + p.ID + "_created", Tenant: p.Tenant, AggregateID: p.ID, Type: "PaymentCreated", Payload: payload}
	return p, ev, nil
}

// baselineRecord is the baseline with the layer's record written beside
// it, and none of the layer's work around the record: the layer's own
// claim statement (payments.ClaimWithPayment: the record, COMPLETED and
// referencing its payment, then the payment and its event), alone in its
// SERIALIZABLE transaction in one round trip, with the request's raw hash
// (fingerprint.RawHash, one SHA-256) in place of the fingerprint too,
// and no engine, group commit or rendered answer. It is the idempotent
// write's floor: what the record's row costs the store, so that the
// layer's code is measured against it (idempotent/baseline and its
// record) and the row against the business write (baseline and its
// record/baseline).
func (w *writer) baselineRecord(st *store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		b := body(w.run, n)
		p, ev, err := baselinePayment(w.tenant, "", b)
		if err != nil {
			return err
		}
		// The request's raw hash, as the layer stores it, stands in for
		// the fingerprint too: a string of the same length, no parse.
		raw := fingerprint.RawHash(payments.Operation, b, "Api-Version", "")
		req := idem.BeginRequest{Scope: idem.Scope{Tenant: w.tenant, Operation: payments.Operation, Key: w.key("r", n)},
			RequestHashes: []string{raw}, HashVersion: fingerprint.Version, RawHash: raw, Owner: "bench", HomeRegion: "bench",
			LockFor: engine.DefaultLockFor, Window: engine.DefaultWindow}
		completion := idem.Completion{Response: idem.Response{Status: 201, ByReference: true},
			ResourceType: payments.ResourceType, ResourceID: p.ID}
		return st.ExecOne(ctx, func(q store.Querier) error {
			inserted, _, err := payments.ClaimWithPayment(ctx, q, req, idem.StatusCompleted, idem.CheckpointCompleted, &completion, p, ev)
			if err == nil && !inserted {
				err = fmt.Errorf("%w: key %d was taken", errUnexpected, n)
			}
			return err
		})
	}
}

// keyTable holds the keys of baselineKey: an idempotency key's three
// columns and its primary key, the least a record in a table of its own
// can be. The suite creates it (createKeyTable); nothing else reads it.
const keyTable = "idemctl_bench_keys"

const createKeyTable = `CREATE TABLE IF NOT EXISTS ` + keyTable + ` (
	tenant_id       TEXT NOT NULL,
	operation_name  TEXT NOT NULL,
	idempotency_key TEXT NOT NULL,
	PRIMARY KEY (tenant_id, operation_name, idempotency_key)
)`

// baselineKeySQL is the claim statement's shape (payments.ClaimWithPayment)
// with the key alone in place of the record: the key inserted ON CONFLICT
// DO NOTHING and, only if it was, the payment and its event, the
// baseline's columns and arguments ($1 to $12) with the operation and key
// after them.
const baselineKeySQL = `WITH k AS (
		INSERT INTO ` + keyTable + ` (tenant_id, operation_name, idempotency_key) VALUES ($1, $13, $14)
		ON CONFLICT DO NOTHING
		RETURNING 1 AS n
	), pay AS (
		INSERT INTO payments (tenant_id, payment_id, account_id, amount_minor, currency, merchant_reference,
			channel, status, provider_key, created_at, updated_at)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now() FROM k
		RETURNING payment_id
	)
	INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload, created_at)
	SELECT $10, $1, payment_id, $11, $12, now() FROM pay
	RETURNING now()`

// baselineKey is baselineRecord with the least record there can be in a
// table of its own: the idempotency key's three columns under a unique
// key, and nothing else of the record (no hash, state, answer, expiry or
// partial index). It is the floor of any layer that keeps its keys beside
// the business rows rather than in them: what a third row and one more
// unique index on a random key cost the store (baseline and its
// key/baseline), whatever the record's columns.
func (w *writer) baselineKey(st *store.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		p, ev, err := baselinePayment(w.tenant, "", body(w.run, n))
		if err != nil {
			return err
		}
		return st.ExecOne(ctx, func(q store.Querier) error {
			var at time.Time
			err := q.QueryRow(ctx, baselineKeySQL, p.Tenant, p.ID, p.AccountID, p.AmountMinor, p.Currency, p.MerchantReference,
				p.Channel, p.Status, p.ProviderKey, ev.ID, ev.Type, string(ev.Payload), payments.Operation, w.key("k", n)).Scan(&at)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: key %d was taken", errUnexpected, n)
			}
			return err
		})
	}
}

// idempotent is payments.Service.Create with a fresh key each time.
func (w *writer) idempotent(svc *payments.Service) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		res, err := svc.Create(ctx, payments.Request{Tenant: w.tenant, Key: w.key("", n), Body: body(w.run, n)})
		if err == nil && (res.Response.Status != 201 || res.Replayed) {
			err = fmt.Errorf("%w: %d replayed=%v", errUnexpected, res.Response.Status, res.Replayed)
		}
		return err
	}
}

func runStore(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteStore, cfg)
	if _, err := st.Pool().Exec(ctx, createKeyTable); err != nil {
		return SuiteReport{}, fmt.Errorf("create %s: %w", keyTable, err)
	}
	ops := []op{
		{OpBaseline, w.baseline(st)},
		{OpBaselineSequential, w.baselineSequential(st)},
		{OpBaselineRecord, w.baselineRecord(st)},
		{OpBaselineKey, w.baselineKey(st)},
		{OpIdempotent, w.idempotent(payments.NewService(st, payments.Config{Region: "bench"}))},
		{OpIdempotentStoredBody, w.idempotent(payments.NewService(st, storedBodies))},
		{OpIdempotentReadFirst, w.idempotent(payments.NewService(st, payments.Config{Region: "bench", ClaimOrder: payments.ReadFirst}))},
	}
	if cfg.ClaimFirst != nil {
		ops = append(ops, op{OpIdempotentClaimFirst, w.idempotent(payments.NewService(cfg.ClaimFirst, payments.Config{Region: "bench"}))})
	}
	results, err := alternate(ctx, cfg, SuiteStore, ops)
	if err != nil {
		return SuiteReport{}, err
	}
	rep := SuiteReport{Suite: SuiteStore, Concurrency: cfg.Concurrency, Results: results,
		Ratios: []Ratio{ratio(results, OpIdempotent, OpBaseline), ratio(results, OpIdempotent, OpBaselineSequential),
			ratio(results, OpIdempotent, OpBaselineRecord), ratio(results, OpBaselineRecord, OpBaseline),
			ratio(results, OpBaselineKey, OpBaseline),
			ratio(results, OpIdempotentStoredBody, OpBaseline),
			ratio(results, OpIdempotentReadFirst, OpBaseline)}}
	if cfg.ClaimFirst != nil {
		rep.Ratios = append(rep.Ratios, ratio(results, OpIdempotentClaimFirst, OpBaseline))
	}
	rep.Payments, rep.Records, err = countRows(ctx, st, w.tenant)
	return rep, err
}

// seedReplays completes cfg.ReplayKeys keys under w.tenant and returns the
// function that retries them in turn, expecting a replay.
func seedReplays(ctx context.Context, svc *payments.Service, w *writer, prefix string, n int) error {
	for i := range n {
		if _, err := svc.Create(ctx, payments.Request{Tenant: w.tenant, Key: w.key(prefix, int64(i)), Body: body(w.run+prefix, int64(i))}); err != nil {
			return fmt.Errorf("seed replay keys: %w", err)
		}
	}
	return nil
}

func replayer(svc *payments.Service, w *writer, prefix string, n int) func(context.Context) error {
	var seq atomic.Int64
	return func(ctx context.Context) error {
		i := seq.Add(1) % int64(n)
		res, err := svc.Create(ctx, payments.Request{Tenant: w.tenant, Key: w.key(prefix, i), Body: body(w.run+prefix, i)})
		if err == nil && !res.Replayed {
			err = fmt.Errorf("%w: key %s-%d was not replayed", errUnexpected, prefix, i)
		}
		return err
	}
}

func runReplay(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteReplay, cfg)
	svc := payments.NewService(st, payments.Config{Region: "bench"})
	stored := payments.NewService(st, storedBodies)
	// Keys "r-N" hold referencing records, "s-N" records with the answer
	// stored; any service replays either.
	if err := seedReplays(ctx, svc, w, "r", cfg.ReplayKeys); err != nil {
		return SuiteReport{}, err
	}
	if err := seedReplays(ctx, stored, w, "s", cfg.ReplayKeys); err != nil {
		return SuiteReport{}, err
	}
	// Statistics, as autovacuum gathers them within a minute of a table's
	// first rows: a generic plan made before any (the tables empty) may
	// look a payment up by the merchant-reference index's tenant prefix
	// instead of its primary key, which makes a referencing record's
	// replay scan all the tenant's payments (docs/benchmarks.md).
	if _, err := st.Pool().Exec(ctx, `ANALYZE idempotency_records, payments`); err != nil {
		return SuiteReport{}, fmt.Errorf("analyze: %w", err)
	}
	// svc chooses its claim order by the retries it sees (write phases:
	// none; replay phases: all); "replay in the claim" always claims
	// first, so each of its replays is the claim statement that finds the
	// key taken.
	ops := []op{{OpWrite, w.idempotent(svc)}, {OpReplay, replayer(svc, w, "r", cfg.ReplayKeys)},
		{OpReplayStoredBody, replayer(svc, w, "s", cfg.ReplayKeys)},
		{OpReplayInClaim, replayer(payments.NewService(st, payments.Config{Region: "bench", ClaimOrder: payments.ClaimFirst}), w, "r", cfg.ReplayKeys)},
		// A service that keeps settled answers in memory, as idemd's
		// does by default: after its first read of each key, a replay
		// costs the request's raw hash and a lookup.
		{OpReplayFromMemory, replayer(payments.NewService(st, payments.Config{Region: "bench",
			AnswerCache: engine.AnswerCache{Bytes: answerCacheBytes}}), w, "r", cfg.ReplayKeys)}}
	if cfg.ClaimFirst != nil {
		ops = append(ops, op{OpReplayClaimFirst, replayer(payments.NewService(cfg.ClaimFirst, payments.Config{Region: "bench"}), w, "r", cfg.ReplayKeys)})
	}
	results, err := alternate(ctx, cfg, SuiteReplay, ops)
	if err != nil {
		return SuiteReport{}, err
	}
	rep := SuiteReport{Suite: SuiteReplay, Concurrency: cfg.Concurrency, Results: results, Seeded: 2 * cfg.ReplayKeys,
		Ratios: []Ratio{ratio(results, OpReplay, OpWrite), ratio(results, OpReplayStoredBody, OpWrite), ratio(results, OpReplayInClaim, OpWrite),
			ratio(results, OpReplayFromMemory, OpWrite)}}
	if cfg.ClaimFirst != nil {
		rep.Ratios = append(rep.Ratios, ratio(results, OpReplayClaimFirst, OpWrite), ratio(results, OpReplay, OpReplayClaimFirst))
	}
	rep.Payments, rep.Records, err = countRows(ctx, st, w.tenant)
	return rep, err
}

package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const article = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`

type fixture struct {
	t        *testing.T
	st       *store.Store
	svc      *payments.Service
	provider *provider.Client
}

// newFixture starts a real provider simulator over HTTP and a payment
// service using it, on a fresh database.
func newFixture(t *testing.T, cfg payments.Config) *fixture {
	t.Helper()
	st, _ := storetest.New(t)
	client := providertest.Start(t)
	cfg.Provider = client
	if cfg.LockFor == 0 {
		cfg.LockFor = 30 * time.Second
	}
	return &fixture{t: t, st: st, svc: payments.NewService(st, cfg), provider: client}
}

func (f *fixture) fault(mode provider.FaultMode, times int, delay time.Duration) {
	f.t.Helper()
	if err := f.provider.SetFault(context.Background(), provider.Fault{Mode: mode, Times: times, Delay: delay}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) create(key string) (payments.Result, error) {
	return f.svc.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: key, Body: []byte(article)})
}

func (f *fixture) charges() provider.ChargeCounts {
	f.t.Helper()
	c, err := f.provider.Charges(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) record(key string) *idem.Record {
	f.t.Helper()
	rec, err := f.st.Get(context.Background(), idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: key})
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func paymentIDOf(t *testing.T, body []byte) string {
	t.Helper()
	var v struct{ PaymentID, ID string }
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return v.PaymentID + v.ID
}

// TestLostProviderAnswer: the provider charges, the answer is lost, the client
// retries: one charge, the same payment id, and the final answer replayed.
func TestLostProviderAnswer(t *testing.T) {
	f := newFixture(t, payments.Config{})
	f.fault(provider.FaultLoseAnswer, 1, 0)
	first, err := f.create("abc-123")
	if err != nil || first.Response.Status != 202 || !first.Unknown || !bytes.Contains(first.Response.Body, []byte(payments.ECodeOutcomeUnknown)) {
		t.Fatalf("first = %d %s, %v; want 202 %s", first.Response.Status, first.Response.Body, err, payments.ECodeOutcomeUnknown)
	}
	id := paymentIDOf(t, first.Response.Body)
	if rec := f.record("abc-123"); rec.Status != idem.StatusUnknown || rec.Checkpoint != payments.CheckpointProviderRequestSent {
		t.Fatalf("record = %s/%s, want UNKNOWN at PROVIDER_REQUEST_SENT", rec.Status, rec.Checkpoint)
	}
	retry, err := f.create("abc-123")
	if err != nil || retry.Response.Status != 201 || paymentIDOf(t, retry.Response.Body) != id {
		t.Fatalf("retry = %d %s, %v; want 201 for %s", retry.Response.Status, retry.Response.Body, err, id)
	}
	again, err := f.create("abc-123")
	if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, retry.Response.Body) {
		t.Errorf("second retry = %+v, %v; want a replay of %s", again, err, retry.Response.Body)
	}
	c := f.charges()
	if c.Total != 1 || c.ByKey[payments.ProviderKey(id)] != 1 {
		t.Errorf("provider charges = %+v, want exactly one for %s", c, payments.ProviderKey(id))
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM payments WHERE status = 'CONFIRMED'`); n != 1 {
		t.Errorf("%d confirmed payments, want 1", n)
	}
}

// TestDeclineReplayed: a decline is a deterministic business rejection,
// replayed to every retry without asking the provider again.
func TestDeclineReplayed(t *testing.T) {
	f := newFixture(t, payments.Config{})
	f.fault(provider.FaultDecline, 1, 0)
	first, err := f.create("k-decline")
	if err != nil || first.Response.Status != 402 || !bytes.Contains(first.Response.Body, []byte(payments.ECodePaymentDeclined)) {
		t.Fatalf("first = %d %s, %v; want 402 PAYMENT_DECLINED", first.Response.Status, first.Response.Body, err)
	}
	retry, err := f.create("k-decline")
	if err != nil || !retry.Replayed || retry.Response.Status != 402 || !bytes.Equal(retry.Response.Body, first.Response.Body) {
		t.Errorf("retry = %d %s replayed=%v, %v; want the same 402 replayed", retry.Response.Status, retry.Response.Body, retry.Replayed, err)
	}
	if rec := f.record("k-decline"); rec.Status != idem.StatusFailedReplayable {
		t.Errorf("record status = %s, want FAILED_REPLAYABLE", rec.Status)
	}
	if c := f.charges(); c.Total != 0 {
		t.Errorf("charges = %+v, want none", c)
	}
}

// TestProvider5xxRetriedWithSameKey: a 5xx before any charge is retryable; the
// retry executes again with the same payment id and provider key.
func TestProvider5xxRetriedWithSameKey(t *testing.T) {
	f := newFixture(t, payments.Config{})
	f.fault(provider.FaultFail, 1, 0)
	_, err := f.create("k-5xx")
	if idem.ErrorCode(err) != payments.ECodeProviderUnavailable {
		t.Fatalf("first = %v, want %s", err, payments.ECodeProviderUnavailable)
	}
	rec := f.record("k-5xx")
	if rec.Status != idem.StatusFailedRetryable {
		t.Fatalf("record = %s, want FAILED_RETRYABLE", rec.Status)
	}
	retry, err := f.create("k-5xx")
	if err != nil || retry.Response.Status != 201 || retry.Replayed {
		t.Fatalf("retry = %+v, %v; want a fresh 201", retry, err)
	}
	id := paymentIDOf(t, retry.Response.Body)
	if id != rec.ResourceID {
		t.Errorf("retry paid %s, the first attempt had %s", id, rec.ResourceID)
	}
	if c := f.charges(); c.Total != 1 || c.ByKey[payments.ProviderKey(id)] != 1 {
		t.Errorf("charges = %+v, want one for %s", c, payments.ProviderKey(id))
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

// TestRecoveryWorkerSettlesUnknown: nobody retries; the worker asks the
// provider and completes the record, so the client's later retry replays.
func TestRecoveryWorkerSettlesUnknown(t *testing.T) {
	f := newFixture(t, payments.Config{})
	f.fault(provider.FaultLoseAnswer, 1, 0)
	first, _ := f.create("k-worker")
	if !first.Unknown {
		t.Fatalf("first = %+v, want unknown", first)
	}
	out, err := f.svc.RecoverBatch(context.Background(), 10)
	if err != nil || out[payments.RecoveryCompleted] != 1 {
		t.Fatalf("RecoverBatch = %v, %v; want 1 completed", out, err)
	}
	if rec := f.record("k-worker"); rec.Status != idem.StatusCompleted || rec.Attempts != 2 {
		t.Errorf("record = %s attempts %d, want COMPLETED after one recovery", rec.Status, rec.Attempts)
	}
	retry, err := f.create("k-worker")
	if err != nil || !retry.Replayed || retry.Response.Status != 201 {
		t.Errorf("retry = %+v, %v; want a 201 replay", retry, err)
	}
	if c := f.charges(); c.Total != 1 {
		t.Errorf("charges = %+v, want 1", c)
	}
	if out, _ := f.svc.RecoverBatch(context.Background(), 10); len(out) != 0 {
		t.Errorf("second pass found work: %v", out)
	}
}

// TestRecoveryWorkerLeavesUnreachableProviderUnknown: a record whose provider
// cannot be asked stays UNKNOWN and is never guessed.
func TestRecoveryWorkerLeavesUnreachableProviderUnknown(t *testing.T) {
	f := newFixture(t, payments.Config{ProviderTimeout: 500 * time.Millisecond})
	f.fault(provider.FaultLoseAnswer, 1, 0)
	if first, _ := f.create("k-down"); !first.Unknown {
		t.Fatalf("first = %+v, want unknown", first)
	}
	down := payments.NewService(f.st, payments.Config{Provider: &provider.Client{BaseURL: "http://127.0.0.1:1"}, LockFor: 30 * time.Second, ProviderTimeout: 500 * time.Millisecond})
	out, err := down.RecoverBatch(context.Background(), 10)
	if err != nil || out[payments.RecoveryUnknown] != 1 {
		t.Fatalf("RecoverBatch = %v, %v; want 1 unknown", out, err)
	}
	if rec := f.record("k-down"); rec.Status != idem.StatusUnknown {
		t.Errorf("record = %s, want UNKNOWN_REQUIRES_RECOVERY", rec.Status)
	}
}

// TestReplayAcrossSchemaChange: a payment answered in v2, then the node is
// redeployed with v3. replay-as-stored returns the v2 bytes; the
// reconstruct-current rule rebuilds the v3 representation.
func TestReplayAcrossSchemaChange(t *testing.T) {
	st, _ := storetest.New(t)
	req := payments.Request{Tenant: "tenant-a", Key: "deploy-1", Body: []byte(article)}
	v2 := payments.NewService(st, payments.Config{ResponseSchema: "v2"})
	first, err := v2.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	id := paymentIDOf(t, first.Response.Body)

	asStored := payments.NewService(st, payments.Config{ResponseSchema: "v3"})
	got, err := asStored.Create(context.Background(), req)
	if err != nil || !got.Replayed || !bytes.Equal(got.Response.Body, first.Response.Body) || got.Response.SchemaVersion != "v2" {
		t.Errorf("replay-as-stored = %s (%s), %v; want the v2 bytes %s", got.Response.Body, got.Response.SchemaVersion, err, first.Response.Body)
	}

	current := payments.NewService(st, payments.Config{ResponseSchema: "v3", ReplayRule: payments.ReconstructCurrent})
	got, err = current.Create(context.Background(), req)
	if err != nil || !got.Replayed || got.Response.Status != 201 {
		t.Fatalf("reconstruct-current = %+v, %v", got, err)
	}
	var v3 map[string]any
	if err := json.Unmarshal(got.Response.Body, &v3); err != nil {
		t.Fatal(err)
	}
	if v3["id"] != id || v3["state"] != "PENDING" || v3["createdAt"] == nil || v3["paymentId"] != nil {
		t.Errorf("reconstructed body = %s, want v3 with id %s", got.Response.Body, id)
	}
	// A new payment under v3 is answered (and stored) in v3.
	fresh, err := current.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: "deploy-2",
		Body: []byte(strings.Replace(article, "invoice-7781", "invoice-7782", 1))})
	if err != nil || fresh.Response.SchemaVersion != "v3" || !bytes.Contains(fresh.Response.Body, []byte(`"state":"PENDING"`)) {
		t.Errorf("v3 create = %s (%s), %v", fresh.Response.Body, fresh.Response.SchemaVersion, err)
	}
	if err := (payments.Config{ResponseSchema: "v9"}).Validate(); err == nil {
		t.Error("unknown schema accepted")
	}
	if err := (payments.Config{ReplayRule: "guess"}).Validate(); err == nil {
		t.Error("unknown replay rule accepted")
	}
}

// TestBusinessIdentityAcrossStores: two regions with separate stores share a
// provider. A client without stable keys sends the same payment (same
// merchant reference) with a fresh key to each, as after a failover before
// the handover: the payment id derives from the business identity, so the
// provider deduplicates it and charges once, and the charge's reference
// tells the new region that another key made it: the fresh key gets the
// 409 DUPLICATE_MERCHANT_REFERENCE the old region would have answered. The
// key that made it, retried in the new region, still gets its 201.
func TestBusinessIdentityAcrossStores(t *testing.T) {
	f := newFixture(t, payments.Config{})
	other, _ := storetest.New(t)
	newHome := payments.NewService(other, payments.Config{Provider: f.provider, LockFor: 30 * time.Second})
	first, err := f.create("key-in-old-region")
	if err != nil || first.Response.Status != 201 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	third, _ := storetest.New(t)
	for i, svc := range []*payments.Service{newHome, payments.NewService(third, payments.Config{Provider: f.provider, LockFor: 30 * time.Second})} {
		uncertain := i == 0 // asks the provider first; the other charges with the same key
		got, err := svc.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: fmt.Sprintf("fresh-%d", i), Body: []byte(article), Uncertain: uncertain})
		if err != nil || got.Response.Status != 409 || !bytes.Contains(got.Response.Body, []byte(payments.ECodeDuplicateMerchantRef)) ||
			!bytes.Contains(got.Response.Body, []byte(paymentIDOf(t, first.Response.Body))) {
			t.Errorf("store %d (uncertain=%v) = %d %s, %v; want 409 %s naming the payment", i, uncertain, got.Response.Status, got.Response.Body, err, payments.ECodeDuplicateMerchantRef)
		}
		again, err := svc.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: fmt.Sprintf("fresh-%d", i), Body: []byte(article), Uncertain: uncertain})
		if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, got.Response.Body) {
			t.Errorf("store %d: the fresh key's retry = %+v, %v; want its 409 replayed", i, again, err)
		}
	}
	// The key that made the payment, retried in the new region before the
	// handover: the payment row there is the fresh key's doing, the charge
	// is this key's: the same 201, byte for byte.
	retry, err := newHome.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: "key-in-old-region", Body: []byte(article), Uncertain: true})
	if err != nil || retry.Response.Status != 201 || !bytes.Equal(retry.Response.Body, first.Response.Body) {
		t.Errorf("the creating key in the new region = %d %s, %v; want %d %s", retry.Response.Status, retry.Response.Body, err, first.Response.Status, first.Response.Body)
	}
	// In one store, the business constraint answers a fresh key directly.
	dup, err := newHome.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: "fresh-again", Body: []byte(article)})
	if err != nil || dup.Response.Status != 409 || !bytes.Contains(dup.Response.Body, []byte(paymentIDOf(t, first.Response.Body))) {
		t.Errorf("fresh key in a store that has the payment = %d %s, %v; want 409 naming it", dup.Response.Status, dup.Response.Body, err)
	}
	if c := f.charges(); c.Total != 1 {
		t.Errorf("charges = %+v, want 1", c)
	}
	// The same merchant reference with another amount is a duplicate, not a
	// second charge.
	changed := strings.Replace(article, `"10.00"`, `"12.00"`, 1)
	got, err := newHome.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: "fresh-other-amount", Body: []byte(changed), Uncertain: true})
	if err != nil || got.Response.Status != 409 || !bytes.Contains(got.Response.Body, []byte(payments.ECodeDuplicateMerchantRef)) {
		t.Errorf("other amount, same reference = %d %s, %v; want 409 %s", got.Response.Status, got.Response.Body, err, payments.ECodeDuplicateMerchantRef)
	}
	if c := f.charges(); c.Total != 1 {
		t.Errorf("charges after the different amount = %+v, want 1", c)
	}
}

// TestProviderKeyConflictFoundByRecovery: the answer of a charge is lost
// and, before the recovery worker asks, the provider holds another amount
// under the payment's provider key. The worker ends the payment CONFLICT
// (never PENDING for ever), reports the "conflict" outcome, and the client's
// retry gets 409 PROVIDER_KEY_CONFLICT, as does a fresh key with the same
// merchant reference, and as does a region that finds the charge by asking
// first (Uncertain).
func TestProviderKeyConflictFoundByRecovery(t *testing.T) {
	f := newFixture(t, payments.Config{})
	f.fault(provider.FaultFail, 1, 0)
	first, err := f.create("k-conflict")
	if idem.ErrorCode(err) != payments.ECodeProviderUnavailable {
		t.Fatalf("first = %+v, %v; want %s", first, err, payments.ECodeProviderUnavailable)
	}
	// The record is left as a lost answer would leave it, and another party
	// charges the key with another amount.
	storetest.Exec(t, f.st, `UPDATE idempotency_records SET status = 'UNKNOWN_REQUIRES_RECOVERY', error_code = $1 WHERE idempotency_key = 'k-conflict'`, payments.ECodeOutcomeUnknown)
	id := payments.PaymentID("tenant-a", "acc_1", "invoice-7781")
	if _, err := f.provider.Charge(context.Background(), provider.ChargeRequest{ProviderKey: payments.ProviderKey(id), AmountMinor: 999, Currency: "EUR", AccountID: "acc_9"}); err != nil {
		t.Fatal(err)
	}
	out, err := f.svc.RecoverBatch(context.Background(), 10)
	if err != nil || out[payments.RecoveryConflict] != 1 {
		t.Fatalf("RecoverBatch = %v, %v; want 1 %s", out, err, payments.RecoveryConflict)
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM payments WHERE payment_id = $1 AND status = $2`, id, payments.PaymentStatusConflict); n != 1 {
		t.Errorf("payment %s is not %s", id, payments.PaymentStatusConflict)
	}
	if rec := f.record("k-conflict"); rec.Status != idem.StatusFailedReplayable || rec.ErrorCode != payments.ECodeProviderKeyConflict {
		t.Errorf("record = %s %s, want %s %s", rec.Status, rec.ErrorCode, idem.StatusFailedReplayable, payments.ECodeProviderKeyConflict)
	}
	for _, key := range []string{"k-conflict", "k-conflict-fresh", "k-conflict-fresh"} {
		got, err := f.create(key)
		if err != nil || got.Response.Status != 409 || !bytes.Contains(got.Response.Body, []byte(payments.ECodeProviderKeyConflict)) || got.ProviderKeyConflict {
			t.Errorf("retry with %s = %d %s (counted again: %v), %v; want 409 %s", key, got.Response.Status, got.Response.Body, got.ProviderKeyConflict, err, payments.ECodeProviderKeyConflict)
		}
	}
	// Another region (its own store) that asks the provider first finds the
	// other charge: the same terminal answer, counted there.
	other, _ := storetest.New(t)
	newHome := payments.NewService(other, payments.Config{Provider: f.provider, LockFor: 30 * time.Second})
	got, err := newHome.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: "k-moved", Body: []byte(article), Uncertain: true})
	if err != nil || got.Response.Status != 409 || !got.ProviderKeyConflict || !bytes.Contains(got.Response.Body, []byte(payments.ECodeProviderKeyConflict)) {
		t.Errorf("uncertain region = %d %s (conflict %v), %v; want 409 %s", got.Response.Status, got.Response.Body, got.ProviderKeyConflict, err, payments.ECodeProviderKeyConflict)
	}
	if n := storetest.Count(t, other, `SELECT count(*) FROM payments WHERE status = 'PENDING'`); n != 0 {
		t.Errorf("%d payments left PENDING in the other region", n)
	}
	if c := f.charges(); c.Total != 1 {
		t.Errorf("charges = %+v, want only the other party's", c)
	}
}

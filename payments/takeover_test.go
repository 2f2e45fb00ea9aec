package payments_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fencing"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/store"
)

// leftAtLocalPayment writes what an owner that died right after its claim
// leaves behind: the record at LOCAL_PAYMENT_CREATED with its payment and
// event, its lock run out. It returns the payment's id.
func leftAtLocalPayment(t *testing.T, st *store.Store, key, merchantRef string) string {
	t.Helper()
	body := fmt.Sprintf(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":%q}`, merchantRef)
	cmd, err := payments.ParseCommand([]byte(body), "")
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := cmd.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	id := payments.PaymentID("tenant-a", cmd.AccountID, cmd.MerchantReference)
	p := payments.Payment{Tenant: "tenant-a", ID: id, AccountID: cmd.AccountID, AmountMinor: cmd.AmountMinor, Currency: cmd.Currency,
		MerchantReference: cmd.MerchantReference, Channel: cmd.Channel, Status: "PENDING", ProviderKey: payments.ProviderKey(id)}
	ev := payments.Event{ID: "evt_" + id + "_created", Tenant: "tenant-a", AggregateID: id, Type: "PaymentCreated", Payload: []byte(`{}`)}
	begin := idem.BeginRequest{Scope: idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: key},
		RequestHashes: hashes, HashVersion: 2, Owner: "dead", HomeRegion: "local", LockFor: time.Minute, Window: time.Hour}
	err = st.ExecTx(context.Background(), func(tx pgx.Tx) error {
		inserted, _, err := payments.ClaimWithPayment(context.Background(), tx, begin, idem.StatusInProgress, payments.CheckpointLocalPaymentCreated, nil, p, ev)
		if err == nil && !inserted {
			err = errors.New("claim not inserted")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = $1`, key)
	return id
}

// TestTakeoverAtLocalPaymentCreated: a record whose owner died before the
// provider call is charged by the client's retry (the client is there to
// get the answer) but only released by the recovery worker, which never
// charges on its own; the client's next retry then charges, once.
func TestTakeoverAtLocalPaymentCreated(t *testing.T) {
	f := newFixture(t, payments.Config{})
	ctx := context.Background()
	retried := leftAtLocalPayment(t, f.st, "k-client", "invoice-1")
	idle := leftAtLocalPayment(t, f.st, "k-idle", "invoice-2")

	res, err := f.svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k-client",
		Body: []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-1"}`)})
	if err != nil || res.Response.Status != 201 || res.Outcome != idem.OutcomeRecover || paymentIDOf(t, res.Response.Body) != retried {
		t.Fatalf("client's retry = %d %s outcome %v, %v; want 201 for %s after a takeover", res.Response.Status, res.Response.Body, res.Outcome, err, retried)
	}
	if c := f.charges(); c.Total != 1 || c.ByKey[payments.ProviderKey(retried)] != 1 {
		t.Fatalf("charges after the client's retry = %+v, want one for %s", c, retried)
	}

	out, err := f.svc.RecoverBatch(ctx, 10)
	if err != nil || out[payments.RecoveryReleased] != 1 || len(out) != 1 {
		t.Fatalf("RecoverBatch = %v, %v; want the idle record released", out, err)
	}
	if c := f.charges(); c.Total != 1 {
		t.Fatalf("the recovery worker charged: %+v", c)
	}
	if rec := f.record("k-idle"); rec.Status != idem.StatusFailedRetryable || rec.Checkpoint != payments.CheckpointLocalPaymentCreated {
		t.Fatalf("idle record = %s at %s, want FAILED_RETRYABLE at LOCAL_PAYMENT_CREATED", rec.Status, rec.Checkpoint)
	}
	res, err = f.svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k-idle",
		Body: []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-2"}`)})
	if err != nil || res.Response.Status != 201 || paymentIDOf(t, res.Response.Body) != idle {
		t.Fatalf("retry of the released record = %d %s, %v", res.Response.Status, res.Response.Body, err)
	}
	if c := f.charges(); c.Total != 2 || c.ByKey[payments.ProviderKey(idle)] != 1 {
		t.Errorf("charges = %+v, want one per payment", c)
	}
}

// TestCreateTakeoverUnderEtcdLock: with a Locker, a retry of an unknown
// outcome takes the record over under the scope's etcd lock: the record
// carries the lock's token, the dead owner's late write is fenced off, and
// the provider is asked before anything is charged again.
func TestCreateTakeoverUnderEtcdLock(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	lease, err := fencing.Grant(context.Background(), cli, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lease.Close(ctx)
	})
	lk, err := fencing.NewLocker(cli, lease, "idem/locks/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	var fencedWrites atomic.Int32
	f := newFixture(t, payments.Config{Locker: lk, OnFenced: func() { fencedWrites.Add(1) }})
	f.fault(provider.FaultLoseAnswer, 1, 0)
	first, err := f.create("k-lock")
	if err != nil || !first.Unknown {
		t.Fatalf("first = %+v, %v; want an unknown outcome", first, err)
	}
	dead := f.record("k-lock")
	retry, err := f.create("k-lock")
	if err != nil || retry.Response.Status != 201 || retry.Outcome != idem.OutcomeRecover {
		t.Fatalf("retry = %d %s outcome %v, %v; want 201 after a takeover", retry.Response.Status, retry.Response.Body, retry.Outcome, err)
	}
	rec := f.record("k-lock")
	if rec.Status != idem.StatusCompleted || rec.FencingToken <= dead.FencingToken {
		t.Fatalf("record = %s with token %d, want COMPLETED under the lock's token (above %d)", rec.Status, rec.FencingToken, dead.FencingToken)
	}
	lost := idem.Lease{Scope: dead.Scope, Token: dead.FencingToken, Owner: dead.Owner}
	if err := f.st.Fail(context.Background(), lost, idem.Failure{Status: idem.StatusUnknown}); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("the dead owner's late write = %v, want ErrFenced", err)
	}
	if c := f.charges(); c.Total != 1 {
		t.Errorf("charges = %+v, want the one charge found by lookup", c)
	}
	if n := fencedWrites.Load(); n != 0 {
		t.Errorf("OnFenced called %d times for an uncontended takeover", n)
	}
}

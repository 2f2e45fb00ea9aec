package payments_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// completedKey returns a store, a create function of a service with
// claim order order, and the answer to the payment it created under key
// "k1" (article).
func completedKey(t *testing.T, order payments.ClaimOrder) (*store.Store, func(key, body string) (payments.Result, error), payments.Result) {
	t.Helper()
	st, _ := storetest.New(t)
	svc := payments.NewService(st, payments.Config{ClaimOrder: order})
	create := func(key, body string) (payments.Result, error) {
		return svc.Create(context.Background(), payments.Request{Tenant: "tenant-a", Key: key, Body: []byte(body)})
	}
	first, err := create("k1", article)
	if err != nil || first.Response.Status != 201 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	return st, create, first
}

// claimElsewhere claims key for article's command as another owner
// would, leaving its record in progress.
func claimElsewhere(t *testing.T, st *store.Store, key string) {
	t.Helper()
	cmd, err := payments.ParseCommand([]byte(article), "")
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := cmd.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Begin(context.Background(), idem.BeginRequest{Scope: idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: key},
		RequestHashes: hashes, HashVersion: fingerprint.Version, Owner: "elsewhere", LockFor: time.Minute, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

// TestCreateReplaysFromOneRead: on the one-statement path (no provider),
// reading first, a retry of a completed payment and a different command
// under its key are answered before any insert attempt; an in-progress or
// expired record still goes through the insert-first claim.
func TestCreateReplaysFromOneRead(t *testing.T) {
	st, create, first := completedKey(t, payments.ReadFirst)
	attempts := storetest.CountClaimAttempts(t, st)

	again, err := create("k1", article)
	if err != nil || !again.Replayed || again.Outcome != idem.OutcomeReplay || !bytes.Equal(again.Response.Body, first.Response.Body) {
		t.Fatalf("retry = %+v, %v; want the stored answer replayed", again, err)
	}
	other := `{"accountId":"acc_1","amount":"11.00","currency":"EUR","merchantReference":"invoice-7781"}`
	if _, err := create("k1", other); idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Errorf("different command = %v, want %s", err, idem.ECodeKeyReused)
	}
	if n := attempts(); n != 0 {
		t.Errorf("%d insert attempts for a completed key; want its answer from one read", n)
	}

	// In progress: falls through to the claim, which answers in progress.
	claimElsewhere(t, st, "k2")
	before := attempts()
	if _, err := create("k2", article); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Errorf("retry of an in-progress key = %v, want %s", err, idem.ECodeInProgress)
	}
	if n := attempts() - before; n != 1 {
		t.Errorf("in-progress key: %d insert attempts, want 1 (the claim)", n)
	}

	// Past its window (by the store's clock): not replayed.
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'k1'`)
	before = attempts()
	res, err := create("k1", article)
	if res.Replayed || res.Outcome != idem.OutcomeExpired {
		t.Errorf("retry after the window = %+v, %v; want a new operation, not a replay", res, err)
	}
	if n := attempts() - before; n < 1 {
		t.Errorf("expired key: %d insert attempts, want the claim", n)
	}
}

// TestCreateClaimsFirst: claiming first, a retry of a completed payment
// and a different command under its key are answered from the claim's own
// statement: one insert attempt that writes nothing (no record, payment or
// event more), the same answer as the first; an in-progress record is
// still decided in a transaction.
func TestCreateClaimsFirst(t *testing.T) {
	st, create, first := completedKey(t, payments.ClaimFirst)
	attempts := storetest.CountClaimAttempts(t, st)
	rows := func() [3]int {
		return [3]int{storetest.Count(t, st, `SELECT count(*) FROM idempotency_records`),
			storetest.Count(t, st, `SELECT count(*) FROM payments`), storetest.Count(t, st, `SELECT count(*) FROM outbox_events`)}
	}
	before := rows()
	again, err := create("k1", article)
	if err != nil || !again.Replayed || again.Outcome != idem.OutcomeReplay || !bytes.Equal(again.Response.Body, first.Response.Body) ||
		again.Response.Status != first.Response.Status {
		t.Fatalf("retry = %+v, %v; want the first answer replayed", again, err)
	}
	other := `{"accountId":"acc_1","amount":"11.00","currency":"EUR","merchantReference":"invoice-7781"}`
	if _, err := create("k1", other); idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Errorf("different command = %v, want %s", err, idem.ECodeKeyReused)
	}
	if n := attempts(); n != 2 {
		t.Errorf("%d insert attempts for a retry and a reuse; want one each (the claim)", n)
	}
	if after := rows(); after != before {
		t.Errorf("records, payments, events %v after a retry and a reuse; want %v (nothing written)", after, before)
	}

	claimElsewhere(t, st, "k2")
	if _, err := create("k2", article); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Errorf("retry of an in-progress key = %v, want %s", err, idem.ECodeInProgress)
	}
}

// TestClaimOrderFollowsRetries: the default order claims first while
// fresh keys are most of the traffic; a run of retries makes it read
// first (a replay then attempts no insert), and a run of fresh keys makes
// it claim first again (a replay attempts the insert).
func TestClaimOrderFollowsRetries(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	svc := payments.NewService(st, payments.Config{})
	create := func(key, ref string) payments.Result {
		t.Helper()
		body := `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + ref + `"}`
		res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: key, Body: []byte(body)})
		if err != nil || res.Response.Status != 201 {
			t.Fatalf("create %s = %+v, %v", key, res, err)
		}
		return res
	}
	create("k0", "r0")
	attempts := storetest.CountClaimAttempts(t, st)
	if s := svc.RetryShare(); s != 0 {
		t.Fatalf("retry share %v after one fresh key; want 0", s)
	}
	before := attempts()
	create("k0", "r0")
	if n := attempts() - before; n != 1 {
		t.Errorf("first retry: %d insert attempts; want 1 (claim first)", n)
	}
	for range 150 {
		create("k0", "r0")
	}
	if s := svc.RetryShare(); s <= 0.6 {
		t.Fatalf("retry share %v after 150 retries; want above 0.6", s)
	}
	before = attempts()
	create("k0", "r0")
	if n := attempts() - before; n != 0 {
		t.Errorf("retry among retries: %d insert attempts; want 0 (read first)", n)
	}
	for i := range 150 {
		create(fmt.Sprintf("f%d", i), fmt.Sprintf("rf%d", i))
	}
	if s := svc.RetryShare(); s >= 0.6 {
		t.Fatalf("retry share %v after 150 fresh keys; want below 0.6", s)
	}
	before = attempts()
	create("k0", "r0")
	if n := attempts() - before; n != 1 {
		t.Errorf("retry among fresh keys: %d insert attempts; want 1 (claim first)", n)
	}
}

// TestCreateWritesOnce: through the engine, a new key without a provider
// still costs one insert and no update of its record (record, payment and
// event in one transaction; no STARTED checkpoint), and a new key with a
// provider writes its checkpoints and result as before: PROVIDER_REQUEST_SENT,
// then PROVIDER_CONFIRMED and COMPLETED in the result's transaction.
func TestCreateWritesOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, payments.Config{})
	local := payments.NewService(f.st, payments.Config{})
	attempts := storetest.CountClaimAttempts(t, f.st)
	storetest.Exec(t, f.st, `CREATE SEQUENCE test_record_updates`)
	storetest.Exec(t, f.st, `CREATE FUNCTION test_count_record_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('test_record_updates'); RETURN NEW; END $$`)
	storetest.Exec(t, f.st, `CREATE TRIGGER test_count_record_update BEFORE UPDATE ON idempotency_records
		FOR EACH ROW EXECUTE FUNCTION test_count_record_update()`)
	updates := func() int {
		return storetest.Count(t, f.st, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM test_record_updates`)
	}

	res, err := local.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k-local", Body: []byte(article)})
	if err != nil || res.Response.Status != 201 || res.Outcome != idem.OutcomeExecute {
		t.Fatalf("local payment = %+v, %v", res, err)
	}
	if a, u := attempts(), updates(); a != 1 || u != 0 {
		t.Fatalf("local payment: %d insert attempts and %d record updates, want 1 and 0", a, u)
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM outbox_events`); n != 1 {
		t.Fatalf("%d outbox events, want the PaymentCreated one", n)
	}

	other := `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-9"}`
	res, err = f.svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k-provider", Body: []byte(other)})
	if err != nil || res.Response.Status != 201 {
		t.Fatalf("provider payment = %+v, %v", res, err)
	}
	if a, u := attempts(), updates(); a != 2 || u != 3 {
		t.Errorf("provider payment: %d insert attempts and %d record updates in all, want 2 and 3", a, u)
	}
}

// TestReplayWaitsForStandbys: a retry of a completed payment is not
// answered while the primary's synchronous standby does not have what was
// read (here a standby that never connects), whichever claim order reads
// it; with no standbys it replays.
func TestReplayWaitsForStandbys(t *testing.T) {
	for _, order := range []payments.ClaimOrder{payments.ReadFirst, payments.ClaimFirst} {
		st, _, _ := completedKey(t, order)
		svc := payments.NewService(st, payments.Config{ClaimOrder: order})
		retry := func(ctx context.Context) (payments.Result, error) {
			return svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(article)})
		}
		storetest.SetSyncStandbys(t, st, "ghost")
		// The deadline is how long the retry waits, not a timing asserted.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		got, err := retry(ctx)
		cancel()
		if err == nil && got.Replayed {
			t.Errorf("order %d: retry with a standby that never has the record replayed", order)
		}
		storetest.SetSyncStandbys(t, st, "")
		if got, err := retry(context.Background()); err != nil || !got.Replayed {
			t.Errorf("order %d: retry without standbys = %+v, %v; want a replay", order, got, err)
		}
	}
}

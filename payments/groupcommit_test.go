package payments_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// paymentBody is a command for merchant reference ref.
func paymentBody(ref string) []byte {
	return []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + ref + `"}`)
}

// createJob is one Create of a batch test and what it got.
type createJob struct {
	key  string
	body []byte
	res  payments.Result
	err  error
	sent []string
}

// runBatched fills both of svc's batches in flight with claims that wait
// on records another transaction is inserting, queues jobs behind them,
// and releases everything once all of jobs wait: the jobs go to the store
// as batches. It returns the claim statements the jobs sent.
func runBatched(t *testing.T, st *store.Store, svc *payments.Service, round string, jobs []*createJob) int {
	t.Helper()
	ctx := context.Background()
	blocker, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	var wg sync.WaitGroup
	// More records than a second batch waits for before it starts.
	blocked := make([]*createJob, 9)
	for i := range blocked {
		key := fmt.Sprintf("%s-blocked-%d", round, i)
		if _, err := blocker.Exec(ctx, `INSERT INTO idempotency_records (tenant_id, operation_name, idempotency_key, request_hash,
			hash_version, status, checkpoint, expires_at) VALUES ('tenant-a', $1, $2, 'x', 1, 'IN_PROGRESS', 'RECEIVED', now() + INTERVAL '1 hour')`,
			payments.Operation, key); err != nil {
			t.Fatal(err)
		}
		blocked[i] = &createJob{key: key, body: paymentBody(key)}
	}
	create := func(j *createJob) {
		j.sent = storetest.Statements(t, func(ctx context.Context) {
			j.res, j.err = svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: j.key, Body: j.body})
		})
	}
	lockWaits := func(n int) func() bool {
		return func() bool {
			return storetest.Count(t, st, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH%'`) == n
		}
	}
	// The first claim goes alone and waits on its uncommitted record: one
	// batch in flight. Claims queue behind it, one at a time, until enough
	// wait for a second batch, which takes them all and waits too.
	wg.Go(func() { create(blocked[0]) })
	waitFor(t, lockWaits(1), "a claim waiting on an uncommitted record")
	used := 1
	for ; payments.ClaimBatchesInFlight(svc) < 2; used++ {
		if used == len(blocked) {
			t.Fatalf("%d claims wait and no second batch started", used-1)
		}
		wg.Go(func() { create(blocked[used]) })
		waitFor(t, func() bool {
			return payments.ClaimBatchesInFlight(svc) == 2 || payments.ClaimsQueued(svc) == used
		}, "a claim queued")
	}
	blocked = blocked[:used]
	waitFor(t, func() bool { return lockWaits(2)() && payments.ClaimsQueued(svc) == 0 }, "a second batch waiting on uncommitted records")
	for _, j := range jobs {
		wg.Go(func() { create(j) })
	}
	waitFor(t, func() bool { return payments.ClaimsQueued(svc) == len(jobs) }, "the jobs queued")
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, j := range blocked {
		if j.err != nil || j.res.Response.Status != 201 {
			t.Errorf("claim of %s after the other transaction rolled back = %+v, %v; want 201", j.key, j.res, j.err)
		}
	}
	claims := 0
	for _, j := range jobs {
		for _, v := range j.sent {
			if v == "WITH" {
				claims++
			}
		}
	}
	return claims
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestClaimsGroupCommit: payments' one-statement claims that queue while
// batches are in flight go to the store as one statement, and each is
// answered as its own statement would answer it: fresh keys get their
// payment, event and 201, a retry of a settled key replays its answer
// byte for byte, and a key reused with another command is refused.
func TestClaimsGroupCommit(t *testing.T) {
	st, _ := storetest.New(t)
	svc := payments.NewService(st, payments.Config{ClaimOrder: payments.ClaimFirst})
	ctx := context.Background()
	first, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "g-done", Body: paymentBody("g-done")})
	if err != nil || first.Response.Status != 201 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	jobs := []*createJob{
		{key: "g-done", body: paymentBody("g-done")},
		{key: "g-done-other", body: paymentBody("g-done")},
	}
	for i := range 6 {
		k := fmt.Sprintf("g-%d", i)
		jobs = append(jobs, &createJob{key: k, body: paymentBody(k)})
	}
	// g-done-other is g-done's command under another key: set up first.
	if _, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "g-reused", Body: paymentBody("g-reused")}); err != nil {
		t.Fatal(err)
	}
	jobs[1] = &createJob{key: "g-reused", body: paymentBody("g-reused-other")}

	if claims := runBatched(t, st, svc, "r1", jobs); claims != 1 {
		t.Errorf("claim statements of %d queued payments = %d, want one batch", len(jobs), claims)
	}
	// The store counts the batch among its operation claims.
	for _, g := range st.GroupStats() {
		if g.Kind == store.GroupOperationClaims && (g.Batches < 1 || g.Batched < uint64(len(jobs))) {
			t.Errorf("operation claims' group stats = %+v, want the batch of %d counted", g, len(jobs))
		}
	}
	if j := jobs[0]; j.err != nil || !j.res.Replayed || j.res.Response.Status != 201 || !bytes.Equal(j.res.Response.Body, first.Response.Body) {
		t.Errorf("retry of g-done = %+v, %v; want a replay of %s", j.res, j.err, first.Response.Body)
	}
	if j := jobs[1]; j.err == nil || idem.ErrorCode(j.err) != idem.ECodeKeyReused {
		t.Errorf("g-reused with another command = %+v, %v; want %s", j.res, j.err, idem.ECodeKeyReused)
	}
	for _, j := range jobs[2:] {
		if j.err != nil || j.res.Response.Status != 201 || j.res.Replayed || !strings.Contains(string(j.res.Response.Body), j.key) {
			t.Errorf("fresh %s = %+v, %v; want its 201", j.key, j.res, j.err)
		}
	}
	// Every payment once, with its event; nothing for the refused key.
	if n := storetest.Count(t, st, `SELECT count(*) FROM payments WHERE merchant_reference NOT LIKE 'r1-blocked-%'`); n != 2+6 {
		t.Errorf("%d payments besides those that waited, want 8 (two before, six fresh)", n)
	}
	if n, m := storetest.Count(t, st, `SELECT count(*) FROM outbox_events`), storetest.Count(t, st, `SELECT count(*) FROM payments`); n != m {
		t.Errorf("%d outbox events for %d payments, want one per payment", n, m)
	}
	// And a retry of each fresh key, alone, replays what the batch answered.
	for _, j := range jobs[2:] {
		res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: j.key, Body: j.body})
		if err != nil || !res.Replayed || !bytes.Equal(res.Response.Body, j.res.Response.Body) {
			t.Errorf("retry of %s = %+v, %v; want a replay of the batch's answer", j.key, res, err)
		}
	}
}

// TestClaimsGroupCommitDuplicateFailsAlone: two keys for one business
// payment in a batch make the store refuse the whole batch; every claim is
// sent again alone, so one key gets the payment, the other 409
// DUPLICATE_MERCHANT_REFERENCE, and the batch's other payment is made.
func TestClaimsGroupCommitDuplicateFailsAlone(t *testing.T) {
	st, _ := storetest.New(t)
	svc := payments.NewService(st, payments.Config{ClaimOrder: payments.ClaimFirst})
	jobs := []*createJob{
		{key: "d-1", body: paymentBody("d-same")},
		{key: "d-2", body: paymentBody("d-same")},
		{key: "d-3", body: paymentBody("d-3")},
	}
	if claims := runBatched(t, st, svc, "r2", jobs); claims != 1+len(jobs) {
		t.Errorf("claim statements = %d, want the refused batch and one for each payment", claims)
	}
	created, dup := 0, 0
	for _, j := range jobs[:2] {
		switch {
		case j.err == nil && j.res.Response.Status == 201:
			created++
		case j.err == nil && j.res.Response.Status == 409 && strings.Contains(string(j.res.Response.Body), payments.ECodeDuplicateMerchantRef):
			dup++
		default:
			t.Errorf("%s = %d %s, %v; want 201 or 409 %s", j.key, j.res.Response.Status, j.res.Response.Body, j.err, payments.ECodeDuplicateMerchantRef)
		}
	}
	if created != 1 || dup != 1 {
		t.Errorf("two keys for one payment: %d created, %d duplicates; want one each", created, dup)
	}
	if j := jobs[2]; j.err != nil || j.res.Response.Status != 201 {
		t.Errorf("d-3 = %+v, %v; want 201", j.res, j.err)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM payments WHERE merchant_reference = 'd-same'`); n != 1 {
		t.Errorf("%d payments for d-same, want 1", n)
	}
}

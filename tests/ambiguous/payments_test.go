package ambiguous_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
	"github.com/idemcoord/idem/tests/commitcut"
)

// TestCreateResolvesAnAmbiguousCommit loses the answer to the commit of the
// one statement (an implicit transaction) that stores a payment and its
// record (no provider), while the store commits it: Create must answer the stored payment, not a
// failure, and one payment exists; in either claim order.
func TestCreateResolvesAnAmbiguousCommit(t *testing.T) {
	for name, order := range map[string]payments.ClaimOrder{"claim first": payments.ClaimFirst, "read first": payments.ReadFirst} {
		t.Run(name, func(t *testing.T) { testCreateResolvesAnAmbiguousCommit(t, order) })
	}
}

func testCreateResolvesAnAmbiguousCommit(t *testing.T, order payments.ClaimOrder) {
	ctx := context.Background()
	direct, dbURL := storetest.New(t)
	st, cut := proxiedStore(t, dbURL)
	svc := payments.NewService(st, payments.Config{ClaimOrder: order})

	cut.Arm(1)
	res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(article)})
	if !cut.Cut() {
		t.Fatal("no COMMIT lost its answer; the test injected nothing")
	}
	if err != nil || res.Response.Status != 201 {
		t.Fatalf("Create with its COMMIT's answer lost = %+v, %v; want the stored payment", res, err)
	}
	if n := storetest.Count(t, direct, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-a'`); n != 1 {
		t.Errorf("payments = %d, want 1", n)
	}
	rec, err := direct.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "k1"})
	if err != nil || rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 || rec.ResourceID == "" {
		t.Fatalf("record = %+v, %v; want COMPLETED with the answer given", rec, err)
	}
	again, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(article)})
	if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, res.Response.Body) {
		t.Errorf("retry = %+v, %v; want the answer given replayed", again, err)
	}
}

// TestCreateResolvesAnAmbiguousBatchCommit loses the answer to the commit
// of a batch of payments' claims (the claims of concurrent requests in one
// statement, store.ClaimOrReadGroup) while the store commits it: every
// request in the batch must answer its stored payment, not a failure, and
// each payment exists once.
//
// Both of the group's batches in flight are claims that wait on records
// other transactions hold: b-0's claim alone, then b-1 to b-4 together (a
// second batch starts beside one in flight once four claims wait); the
// payments queued meanwhile go as one batch once b-0's transaction rolls
// back and its claim commits, so the batch's commit is the second.
func TestCreateResolvesAnAmbiguousBatchCommit(t *testing.T) {
	ctx := context.Background()
	direct, dbURL := storetest.New(t)
	st, cut := proxiedStoreConns(t, dbURL, 12)
	svc := payments.NewService(st, payments.Config{ClaimOrder: payments.ClaimFirst})
	body := func(ref string) []byte {
		return []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + ref + `"}`)
	}
	type job struct {
		key string
		res payments.Result
		err error
	}
	create := func(j *job) {
		j.res, j.err = svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: j.key, Body: body(j.key)})
	}

	// Five transactions each hold a record the store's claims will wait on.
	var holders [5]pgx.Tx
	var blocked [5]*job
	for i := range holders {
		tx, err := direct.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		key := fmt.Sprintf("b-%d", i)
		if _, err := tx.Exec(ctx, `INSERT INTO idempotency_records (tenant_id, operation_name, idempotency_key, request_hash,
			hash_version, status, checkpoint, expires_at) VALUES ('tenant-a', $1, $2, 'x', 1, 'IN_PROGRESS', 'RECEIVED', now() + INTERVAL '1 hour')`,
			payments.Operation, key); err != nil {
			t.Fatal(err)
		}
		holders[i], blocked[i] = tx, &job{key: key}
	}
	var wg sync.WaitGroup
	waiting := func(n int, what string) {
		for deadline := time.Now().Add(30 * time.Second); storetest.Count(t, direct, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH%'`) != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never waited on a held record", what)
			}
		}
	}
	// b-0's claim goes alone and waits; b-1 to b-4 then queue beside it
	// until the fourth starts the second batch, which waits too: two
	// statements in flight.
	wg.Go(func() { create(blocked[0]) })
	waiting(1, "the first claim")
	for _, j := range blocked[1:] {
		wg.Go(func() { create(j) })
	}
	waiting(2, "the second batch")
	jobs := make([]*job, 6)
	for i := range jobs {
		jobs[i] = &job{key: fmt.Sprintf("k-%d", i)}
		wg.Go(func() { create(jobs[i]) })
	}
	// The jobs queue behind the two batches in flight (the group runs no
	// more); give their goroutines time to get there.
	time.Sleep(time.Second)
	done := cut.Arm(2)
	if err := holders[0].Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	for _, h := range holders[1:] {
		if err := h.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()

	resolved := 0
	for _, j := range append(jobs, blocked[:]...) {
		if j.err != nil || j.res.Response.Status != 201 || !strings.Contains(string(j.res.Response.Body), j.key) {
			t.Errorf("%s = %d %s, %v; want its payment's 201", j.key, j.res.Response.Status, j.res.Response.Body, j.err)
		}
		if j.res.Replayed {
			resolved++
		}
		if n := storetest.Count(t, direct, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-a' AND merchant_reference = $1`, j.key); n != 1 {
			t.Errorf("payments of %s = %d, want 1", j.key, n)
		}
		again, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: j.key, Body: body(j.key)})
		if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, j.res.Response.Body) {
			t.Errorf("retry of %s = %+v, %v; want the answer given replayed", j.key, again, err)
		}
	}
	// The lost commit was the batch's: its requests were answered from
	// the records the batch had stored.
	if resolved < 2 {
		t.Errorf("%d requests answered from a record their lost commit stored; want the batch's (at least two)", resolved)
	}
}

// TestCreateContinuesItsOwnClaim loses the answer to the commit of a
// payment's claim with a provider (the record IN_PROGRESS at
// LOCAL_PAYMENT_CREATED with its payment and event), while the store
// commits it: the request's next attempt finds the record its lost commit
// stored under its claim id and goes on with it, so Create charges once
// and answers 201, not STORE_UNAVAILABLE or "in progress"; in either claim
// order, and with the claims' group commit or without.
func TestCreateContinuesItsOwnClaim(t *testing.T) {
	for name, cfg := range map[string]struct {
		order   payments.ClaimOrder
		noGroup bool
	}{
		"claim first":                  {order: payments.ClaimFirst},
		"read first":                   {order: payments.ReadFirst},
		"claim first, no group commit": {order: payments.ClaimFirst, noGroup: true},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			cut := commitcut.New(t, dbURL)
			st, err := store.Open(ctx, cut.URL, store.Options{MaxConns: 4, NoGroupCommit: cfg.noGroup})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			prov := providertest.Start(t)
			svc := payments.NewService(st, payments.Config{ClaimOrder: cfg.order, Provider: prov, LockFor: 30 * time.Second})

			cut.Arm(1)
			res, err := svc.Create(ctx, payments.Request{Tenant: tenant, Key: "k1", Body: []byte(article)})
			if !cut.Cut() {
				t.Fatal("no COMMIT lost its answer; the test injected nothing")
			}
			if err != nil || res.Response.Status != 201 || res.Replayed {
				t.Fatalf("Create with its claim's COMMIT answer lost = %d %s replayed=%v, %v; want its own 201",
					res.Response.Status, res.Response.Body, res.Replayed, err)
			}
			charges, err := prov.Charges(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if charges.Total != 1 {
				t.Errorf("provider charges = %+v, want one", charges)
			}
			if n := storetest.Count(t, direct, `SELECT count(*) FROM payments WHERE tenant_id = $1`, tenant); n != 1 {
				t.Errorf("payments = %d, want 1", n)
			}
			rec, err := direct.Get(ctx, idem.Scope{Tenant: tenant, Operation: payments.Operation, Key: "k1"})
			if err != nil || rec.Status != idem.StatusCompleted || rec.Attempts != 1 || rec.FencingToken != 1 {
				t.Fatalf("record = %+v, %v; want COMPLETED by its first claim (attempt 1, token 1)", rec, err)
			}
			again, err := svc.Create(ctx, payments.Request{Tenant: tenant, Key: "k1", Body: []byte(article)})
			if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, res.Response.Body) {
				t.Errorf("retry = %+v, %v; want the answer given replayed", again, err)
			}
		})
	}
}

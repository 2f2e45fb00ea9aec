package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// orderClaim is an operation with a table of its own (orders, one per
// business reference) claimed as payments claims: the record written
// COMPLETED, referencing its order, in the claim's statement.
var orderClaim = store.NewClaimOrReadWith(`, written AS (
		INSERT INTO orders (tenant_id, order_id, ref, amount) SELECT $1, $2, $3, $4 FROM claim
		RETURNING now() AS at)`, 4, "order",
	`SELECT * FROM orders WHERE tenant_id = $1 AND order_id = r.resource_id`, "order_id", "amount")

func newOrderGroup(t *testing.T) (*store.Store, *store.ClaimOrReadGroup) {
	st, _ := storetest.New(t)
	storetest.Exec(t, st, `CREATE TABLE orders (tenant_id TEXT NOT NULL, order_id TEXT NOT NULL, ref TEXT NOT NULL,
		amount BIGINT NOT NULL, PRIMARY KEY (tenant_id, order_id), CONSTRAINT orders_ref UNIQUE (tenant_id, ref))`)
	return st, st.NewClaimOrReadGroup(orderClaim, `, written AS (
		INSERT INTO orders (tenant_id, order_id, ref, amount) SELECT a1, a2, a3, a4 FROM claimed ORDER BY a1, a2
		RETURNING 1)`, []string{"TEXT", "TEXT", "TEXT", "INT8"}, "order",
		`SELECT * FROM orders WHERE tenant_id = r.tenant_id AND order_id = r.resource_id`, "order_id", "amount")
}

// orderJob is one claim of an order: its key, request hash, order id,
// reference and amount, and what it reads back.
type orderJob struct {
	key, hash, id, ref string
	amount             int64
	out                store.ClaimOrRead
	err                error
	readID             pgtype.Text
	readAmount         pgtype.Int8
}

func (j *orderJob) exec(ctx context.Context, g *store.ClaimOrReadGroup) {
	c := idem.Completion{Response: idem.Response{Status: 201, SchemaVersion: "v2", ByReference: true}, ResourceType: "order", ResourceID: j.id}
	j.out, j.err = g.Exec(ctx, beginReq(j.key, j.hash), idem.StatusCompleted, idem.CheckpointCompleted, &c, "order", j.id,
		[]any{"t1", j.id, j.ref, j.amount}, &j.readID, &j.readAmount)
}

// runHeld queues jobs on g while it is held, releases them as one batch,
// and returns the statements they sent.
func runHeld(t *testing.T, g *store.ClaimOrReadGroup, jobs []*orderJob) []string {
	t.Helper()
	queued, release := store.HoldClaimOrRead(g)
	var (
		wg     sync.WaitGroup
		sentMu sync.Mutex
		sent   []string
	)
	for _, j := range jobs {
		wg.Go(func() {
			verbs := statements(t, func(ctx context.Context) { j.exec(ctx, g) })
			sentMu.Lock()
			sent = append(sent, verbs...)
			sentMu.Unlock()
		})
	}
	waitQueued(t, queued, len(jobs), "claims")
	release()
	wg.Wait()
	return sent
}

// TestClaimOrReadGroup: claims of an operation with its own table that
// queue while a batch is in flight go to the store in one statement, and
// each is decided as its own statement decides it: free keys are claimed
// with their rows, a settled key with the same request is a replay read
// with the row it references and with another request a conflict
// (nothing written for either), and an open key is left to the caller.
func TestClaimOrReadGroup(t *testing.T) {
	st, g := newOrderGroup(t)
	ctx := context.Background()
	for _, j := range []*orderJob{{key: "o-done", hash: "v1:a", id: "ord-done", ref: "ref-done", amount: 7},
		{key: "o-other", hash: "v1:a", id: "ord-other", ref: "ref-other", amount: 8}} {
		if j.exec(ctx, g); j.err != nil || !j.out.Inserted {
			t.Fatalf("claim of %s = %+v, %v", j.key, j.out, j.err)
		}
	}
	if _, err := st.Begin(ctx, beginReq("o-open", "v1:a")); err != nil {
		t.Fatal(err)
	}
	jobs := []*orderJob{
		{key: "o-1", hash: "v1:a", id: "ord-1", ref: "ref-1", amount: 1},
		{key: "o-2", hash: "v1:b", id: "ord-2", ref: "ref-2", amount: 2},
		{key: "o-done", hash: "v1:a", id: "ord-done", ref: "ref-done", amount: 7},
		{key: "o-other", hash: "v1:b", id: "ord-x", ref: "ref-x", amount: 9},
		{key: "o-open", hash: "v1:a", id: "ord-open", ref: "ref-open", amount: 3},
	}
	sent := runHeld(t, g, jobs)
	if len(sent) != 1 || sent[0] != "WITH" {
		t.Errorf("statements sent %v, want one for %d claims", sent, len(jobs))
	}
	for _, j := range jobs {
		if j.err != nil {
			t.Fatalf("claim of %s: %v", j.key, j.err)
		}
	}
	for _, j := range jobs[:2] {
		if !j.out.Inserted || j.out.Settled || j.out.At.IsZero() {
			t.Errorf("claim of %s = %+v, want it inserted with its time", j.key, j.out)
		}
		var amount int64
		if err := st.Pool().QueryRow(ctx, `SELECT amount FROM orders WHERE tenant_id = 't1' AND order_id = $1`, j.id).Scan(&amount); err != nil || amount != j.amount {
			t.Errorf("order of %s = %d, %v; want %d", j.key, amount, err, j.amount)
		}
		rec, err := st.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: j.key})
		if err != nil || rec.Status != idem.StatusCompleted || rec.ResourceID != j.id || rec.RequestHash != j.hash {
			t.Errorf("record of %s = %+v, %v; want COMPLETED, referencing %s", j.key, rec, err, j.id)
		}
	}
	if j := jobs[2]; !j.out.Settled || j.out.Decision.Outcome != idem.OutcomeReplay || j.readID.String != "ord-done" || j.readAmount.Int64 != 7 {
		t.Errorf("retry of o-done = %+v with order %v %v; want a replay read with its order", j.out, j.readID, j.readAmount)
	}
	if j := jobs[3]; !j.out.Settled || j.out.Decision.Outcome != idem.OutcomeConflict {
		t.Errorf("o-other with another request = %+v; want a conflict", j.out)
	}
	if j := jobs[4]; j.out.Inserted || j.out.Settled {
		t.Errorf("o-open = %+v; want it neither claimed nor settled", j.out)
	}
	var orders int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id IN ('ord-x', 'ord-open')`).Scan(&orders); err != nil || orders != 0 {
		t.Errorf("orders of the conflict and the open key = %d, %v; want none", orders, err)
	}
}

// TestClaimOrReadGroupViolationFailsAlone: a batch whose operation's write
// violates its table's constraint (two keys, one business reference) is
// refused as a whole, and each of its claims is sent again alone: the
// first claims its key, the other fails with the violation and writes
// nothing, and a third claim in the same batch is not harmed.
func TestClaimOrReadGroupViolationFailsAlone(t *testing.T) {
	st, g := newOrderGroup(t)
	ctx := context.Background()
	jobs := []*orderJob{
		{key: "v-1", hash: "v1:a", id: "ord-v1", ref: "ref-same", amount: 1},
		{key: "v-2", hash: "v1:a", id: "ord-v2", ref: "ref-same", amount: 2},
		{key: "v-3", hash: "v1:a", id: "ord-v3", ref: "ref-3", amount: 3},
	}
	sent := runHeld(t, g, jobs)
	// The batch, then each claim alone (a new connection's setup may come
	// between).
	claims := 0
	for _, v := range sent {
		if v == "WITH" {
			claims++
		}
	}
	if claims != 4 {
		t.Errorf("statements sent %v, want the batch and three alone", sent)
	}
	won, lost := 0, 0
	for _, j := range jobs[:2] {
		var pgErr *pgconn.PgError
		_, recErr := st.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: j.key})
		switch {
		case j.err == nil && j.out.Inserted && recErr == nil:
			won++
		case errors.As(j.err, &pgErr) && pgErr.ConstraintName == "orders_ref" && errors.Is(recErr, idem.ErrRecordNotFound):
			lost++
		default:
			t.Errorf("claim of %s = %+v, %v (record: %v); want it claimed, or refused by orders_ref with no record", j.key, j.out, j.err, recErr)
		}
	}
	if won != 1 || lost != 1 {
		t.Errorf("of two keys with one reference, %d claimed and %d refused; want one each", won, lost)
	}
	if j := jobs[2]; j.err != nil || !j.out.Inserted {
		t.Errorf("claim of v-3 = %+v, %v; want it claimed", j.out, j.err)
	}
}

// TestClaimOrReadGroupExpectFree: a claim that expects its key free is,
// alone, the claim and the operation's writes without the read: a free
// key is claimed with its row; a key taken by a settled record reports
// neither claimed nor settled (the caller decides), reads nothing into the
// caller's columns and writes nothing. In a batch, the same claim is read
// as the batch reads every claim.
func TestClaimOrReadGroupExpectFree(t *testing.T) {
	st, g := newOrderGroup(t)
	ctx := context.Background()
	expectFree := func(ctx context.Context, j *orderJob) {
		c := idem.Completion{Response: idem.Response{Status: 201, SchemaVersion: "v2", ByReference: true}, ResourceType: "order", ResourceID: j.id}
		j.out, j.err = g.ExecExpectFree(ctx, beginReq(j.key, j.hash), idem.StatusCompleted, idem.CheckpointCompleted, &c, "order", j.id,
			[]any{"t1", j.id, j.ref, j.amount}, &j.readID, &j.readAmount)
	}
	fresh := &orderJob{key: "f-1", hash: "v1:a", id: "ord-f1", ref: "ref-f1", amount: 5}
	if sent := statements(t, func(ctx context.Context) { expectFree(ctx, fresh) }); fresh.err != nil || !fresh.out.Inserted ||
		fresh.out.At.IsZero() || len(sent) != 1 || sent[0] != "WITH" {
		t.Fatalf("fresh claim = %+v, %v, sent %v; want it inserted with its time, one statement", fresh.out, fresh.err, sent)
	}
	retry := &orderJob{key: "f-1", hash: "v1:a", id: "ord-f1", ref: "ref-f1", amount: 5}
	if sent := statements(t, func(ctx context.Context) { expectFree(ctx, retry) }); retry.err != nil || retry.out.Inserted ||
		retry.out.Settled || retry.readID.Valid || len(sent) != 1 {
		t.Errorf("retry of a settled key = %+v (read %v), %v, sent %v; want one statement, neither claimed nor settled, nothing read",
			retry.out, retry.readID, retry.err, sent)
	}
	var orders int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = 'ord-f1'`).Scan(&orders); err != nil || orders != 1 {
		t.Errorf("orders of f-1 = %d, %v; want the first claim's alone", orders, err)
	}
	// The same retry queued with another claim goes in their batch, which
	// reads the settled record.
	queued, release := store.HoldClaimOrRead(g)
	again := &orderJob{key: "f-1", hash: "v1:a", id: "ord-f1", ref: "ref-f1", amount: 5}
	other := &orderJob{key: "f-2", hash: "v1:a", id: "ord-f2", ref: "ref-f2", amount: 6}
	var wg sync.WaitGroup
	wg.Go(func() { expectFree(ctx, again) })
	wg.Go(func() { other.exec(ctx, g) })
	waitQueued(t, queued, 2, "claims")
	release()
	wg.Wait()
	if again.err != nil || !again.out.Settled || again.out.Decision.Outcome != idem.OutcomeReplay || again.readID.String != "ord-f1" {
		t.Errorf("retry in a batch = %+v (read %v), %v; want a replay read with its order", again.out, again.readID, again.err)
	}
	if other.err != nil || !other.out.Inserted {
		t.Errorf("the batch's other claim = %+v, %v; want it inserted", other.out, other.err)
	}
}

// TestClaimsKeepTheirClaimID: a record an operation's claim inserts
// open (IN_PROGRESS) carries the request's claim id, alone and in a
// batch, so that the request's next attempt after an unanswered commit
// (idem.BeginRequest.ClaimID) is handed the record back by
// DecideExisting, while a request with another claim id finds it in
// progress.
func TestClaimsKeepTheirClaimID(t *testing.T) {
	st, g := newOrderGroup(t)
	ctx := context.Background()
	open := func(j *orderJob) {
		req := beginReq(j.key, j.hash)
		req.ClaimID = "claim-" + j.key
		j.out, j.err = g.Exec(ctx, req, idem.StatusInProgress, idem.CheckpointReceived, nil, "order", j.id,
			[]any{"t1", j.id, j.ref, j.amount}, &j.readID, &j.readAmount)
	}
	alone := &orderJob{key: "c-alone", hash: "v1:a", id: "ord-alone", ref: "ref-alone", amount: 1}
	if open(alone); alone.err != nil || !alone.out.Inserted {
		t.Fatalf("claim alone = %+v, %v", alone.out, alone.err)
	}
	batch := []*orderJob{{key: "c-1", hash: "v1:a", id: "ord-1", ref: "ref-1", amount: 1},
		{key: "c-2", hash: "v1:a", id: "ord-2", ref: "ref-2", amount: 2}}
	queued, release := store.HoldClaimOrRead(g)
	var wg sync.WaitGroup
	for _, j := range batch {
		wg.Go(func() { open(j) })
	}
	waitQueued(t, queued, len(batch), "claims")
	release()
	wg.Wait()
	for _, j := range append(batch, alone) {
		if j.err != nil || !j.out.Inserted {
			t.Fatalf("claim of %s = %+v, %v", j.key, j.out, j.err)
		}
		decide := func(claim string) idem.Decision {
			t.Helper()
			req := beginReq(j.key, j.hash)
			req.ClaimID = claim
			var d idem.Decision
			if err := st.ExecTx(ctx, func(tx pgx.Tx) (err error) {
				d, err = store.DecideExisting(ctx, tx, req)
				return err
			}); err != nil {
				t.Fatalf("decide %s: %v", j.key, err)
			}
			return d
		}
		if d := decide("claim-" + j.key); d.Outcome != idem.OutcomeExecute || d.Lease.Token != 1 {
			t.Errorf("%s decided under its own claim id = %s (token %d), want execute with the claim's lease", j.key, d.Outcome, d.Lease.Token)
		}
		if d := decide("another"); d.Outcome != idem.OutcomeInProgress || d.Lease.Token != 0 {
			t.Errorf("%s decided under another claim id = %s (token %d), want in progress", j.key, d.Outcome, d.Lease.Token)
		}
	}
}

package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// TestCleanupInBatches: bodies of settled records past their window are
// dropped first (metadata kept and never replayed), in bounded batches; the
// metadata goes later; unsettled records are never touched.
func TestCleanupInBatches(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	for i := range 5 {
		d, err := st.Begin(ctx, beginReq(fmt.Sprintf("done-%d", i), "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, d.Lease, completion(`{"secret":"card data"}`)); err != nil {
			t.Fatal(err)
		}
	}
	unknown, _ := st.Begin(ctx, beginReq("unknown", "v1:a"))
	if err := st.Fail(ctx, unknown.Lease, idem.Failure{Status: idem.StatusUnknown, ErrorCode: "X"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Begin(ctx, beginReq("running", "v1:a")); err != nil {
		t.Fatal(err)
	}
	fresh, _ := st.Begin(ctx, beginReq("fresh", "v1:a"))
	if err := st.Complete(ctx, fresh.Lease, completion(`{}`)); err != nil {
		t.Fatal(err)
	}
	// Everything but "fresh" is two hours old with a one-hour window.
	storetest.Exec(t, st, `UPDATE idempotency_records SET created_at = now() - INTERVAL '2 hours',
		expires_at = now() - INTERVAL '1 hour' WHERE idempotency_key <> 'fresh'`)

	cfg := store.CleanupConfig{BodyRetention: time.Hour, MetadataRetention: 24 * time.Hour, BatchSize: 2, Pause: time.Millisecond}
	res, err := st.Cleanup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.BodiesPruned != 5 || res.RecordsDeleted != 0 || res.Batches < 4 {
		t.Errorf("first pass = %+v, want 5 bodies pruned in >= 3 batches (+1 delete batch), nothing deleted", res)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE response_body IS NOT NULL`); n != 1 {
		t.Errorf("%d records still hold a body, want 1 (fresh)", n)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE status = 'EXPIRED' AND request_hash = 'v1:a' AND resource_id = 'x1'`); n != 5 {
		t.Errorf("%d pruned records kept their metadata, want 5", n)
	}
	for key, want := range map[string]idem.Status{"unknown": idem.StatusUnknown, "running": idem.StatusInProgress} {
		rec, err := st.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: key})
		if err != nil || rec.Status != want {
			t.Errorf("%s: %v, %v; want untouched %s", key, rec, err, want)
		}
	}
	// A retry of a pruned key is a new operation, never a replay of nothing.
	d, err := st.Begin(ctx, beginReq("done-0", "v1:a"))
	if err != nil || d.Outcome != idem.OutcomeExpired {
		t.Errorf("retry of pruned key = %v, %v; want expired (new operation)", d.Outcome, err)
	}

	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '25 hours' WHERE status = 'EXPIRED'`)
	res, err = st.Cleanup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.RecordsDeleted != 4 {
		t.Errorf("second pass deleted %d, want the 4 expired records", res.RecordsDeleted)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records`); n != 4 {
		t.Errorf("%d records left, want 4 (unknown, running, fresh, done-0 reused)", n)
	}
}

// TestCleanupLeavesReferencingRecords: a record that references its
// resource keeps no answer, so cleanup has nothing to drop: past its window
// it is left as it is (not rewritten), a retry of its key is a new
// operation all the same, and it is deleted once the metadata retention has
// passed. A record that keeps its answer is pruned before it is deleted,
// even past the metadata retention.
func TestCleanupLeavesReferencingRecords(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	byRef := idem.Completion{Response: idem.Response{Status: 201, SchemaVersion: "v2", ByReference: true}, ResourceType: "thing", ResourceID: "x1"}
	for i, c := range []idem.Completion{byRef, byRef, completion(`{"id":"x1"}`)} {
		d, err := st.Begin(ctx, beginReq(fmt.Sprintf("k%d", i), "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, d.Lease, c); err != nil {
			t.Fatal(err)
		}
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET created_at = now() - INTERVAL '2 hours', expires_at = now() - INTERVAL '1 hour'`)
	written := func() map[string]string {
		rows, err := st.Pool().Query(ctx, `SELECT idempotency_key, status || '/' || xmin::TEXT FROM idempotency_records ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		m, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv [2]string, err error) {
			err = r.Scan(&kv[0], &kv[1])
			return kv, err
		})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, kv := range m {
			out[kv[0]] = kv[1]
		}
		return out
	}
	before := written()

	cfg := store.CleanupConfig{BodyRetention: time.Hour, MetadataRetention: 24 * time.Hour, BatchSize: 10, Pause: time.Millisecond}
	res, err := st.Cleanup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.BodiesPruned != 1 || res.RecordsDeleted != 0 {
		t.Errorf("first pass = %+v, want the one stored answer pruned, nothing deleted", res)
	}
	after := written()
	for _, k := range []string{"k0", "k1"} {
		if after[k] != before[k] {
			t.Errorf("referencing record %s rewritten by cleanup: %s, then %s", k, before[k], after[k])
		}
	}
	if after["k2"] == before["k2"] || !strings.HasPrefix(after["k2"], "EXPIRED/") {
		t.Errorf("record with a stored answer: %s, then %s; want it pruned to EXPIRED", before["k2"], after["k2"])
	}
	// Past its window, a referencing record is a new operation to a retry.
	if d, err := st.Begin(ctx, beginReq("k0", "v1:a")); err != nil || d.Outcome != idem.OutcomeExpired {
		t.Errorf("retry of a referencing record past its window = %v, %v; want expired (new operation)", d.Outcome, err)
	}

	// A stored answer not yet past its body retention is kept, and so is
	// its record, whatever the metadata retention says.
	d, err := st.Begin(ctx, beginReq("k3", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"id":"x3"}`)); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '25 hours' WHERE idempotency_key <> 'k0'`)
	res, err = st.Cleanup(ctx, store.CleanupConfig{BodyRetention: 48 * time.Hour, MetadataRetention: 24 * time.Hour, BatchSize: 10, Pause: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.BodiesPruned != 0 || res.RecordsDeleted != 2 {
		t.Errorf("second pass = %+v, want k1 and k2 deleted, k3's answer kept", res)
	}
	left := written()
	if len(left) != 2 || left["k0"] == "" || left["k3"] == "" {
		t.Errorf("records left: %v; want k0 (reused) and k3 (answer within its retention)", left)
	}
}

package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// completeKey claims key under hash and completes it.
func completeKey(t *testing.T, st *store.Store, key, hash string) {
	t.Helper()
	ctx := context.Background()
	d, err := st.Begin(ctx, beginReq(key, hash))
	if err != nil || d.Outcome != idem.OutcomeExecute {
		t.Fatalf("Begin %s = %v, %v; want execute", key, d.Outcome, err)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"id":"`+key+`"}`)); err != nil {
		t.Fatalf("Complete %s: %v", key, err)
	}
}

// TestReplayReadWritesNothing: once more than a tenth of the store's
// claims find their key taken, a retry of a completed key, and a different
// command under it, are answered from the claim's one statement, whose
// insert the key's record turns away (ON CONFLICT DO NOTHING): no
// transaction, and the record is not written (its row version stays).
// While they are fewer, the plain insert is turned away and a transaction
// reads the record, writing nothing either. The record's hash is compared
// against every hash version the request carries, and another tenant's
// identical key is still a new claim.
func TestReplayReadWritesNothing(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	completeKey(t, st, "done", "v1:a")
	completeKey(t, st, "rejected", "v1:r")
	storetest.Exec(t, st, `UPDATE idempotency_records SET status = 'FAILED_REPLAYABLE' WHERE idempotency_key = 'rejected'`)
	version := func(key string) string {
		t.Helper()
		var xmin string
		if err := st.Pool().QueryRow(ctx, `SELECT xmin::text FROM idempotency_records WHERE idempotency_key = $1`, key).Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		return xmin
	}
	before := version("done") + "/" + version("rejected")
	one := func(what string, req idem.BeginRequest, want idem.Outcome) *idem.Record {
		t.Helper()
		var (
			got idem.Decision
			err error
		)
		sent := statements(t, func(ctx context.Context) { got, err = st.Begin(ctx, req) })
		if err != nil || got.Outcome != want || !slices.Equal(sent, []string{"WITH"}) {
			t.Errorf("%s = %v, %v, sent %v; want %v from one statement", what, got.Outcome, err, sent, want)
		}
		return got.Record
	}
	var rare idem.Decision
	sent := statements(t, func(ctx context.Context) { rare, _ = st.Begin(ctx, beginReq("done", "v1:a")) })
	if rare.Outcome != idem.OutcomeReplay || rare.Record == nil || string(rare.Record.Response.Body) != `{"id":"done"}` ||
		!slices.Equal(sent, []string{"INSERT", "BEGIN", "SELECT", "COMMIT"}) {
		t.Errorf("retry while retries are rare = %+v, sent %v; want the stored answer after the plain insert and a read", rare, sent)
	}
	for range 6 {
		if d, err := st.Begin(ctx, beginReq("done", "v1:a")); err != nil || d.Outcome != idem.OutcomeReplay {
			t.Fatalf("retry = %v, %v; want replay", d.Outcome, err)
		}
	}
	if rec := one("retry", beginReq("done", "v1:a"), idem.OutcomeReplay); rec == nil || string(rec.Response.Body) != `{"id":"done"}` {
		t.Fatalf("retry's record %+v; want the stored body", rec)
	}
	older := beginReq("done", "v2:new")
	older.RequestHashes = append(older.RequestHashes, "v1:a")
	one("retry hashed under two versions", older, idem.OutcomeReplay)
	one("different command", beginReq("done", "v1:b"), idem.OutcomeConflict)
	one("retry of a replayable failure", beginReq("rejected", "v1:r"), idem.OutcomeReplay)
	if after := version("done") + "/" + version("rejected"); after != before {
		t.Errorf("row versions %s, then %s: a replay wrote its record", before, after)
	}
	other := beginReq("done", "v1:a")
	other.Tenant = "t2"
	one("other tenant's key", other, idem.OutcomeExecute)
}

// TestReplayReadFallsThrough: every record that is not settled inside its
// window goes to the insert-first claim, and is decided as before.
func TestReplayReadFallsThrough(t *testing.T) {
	ctx := context.Background()
	st, url := storetest.New(t)

	running, err := st.Begin(ctx, beginReq("running", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	retryable, err := st.Begin(ctx, beginReq("retryable", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(ctx, retryable.Lease, idem.Failure{Status: idem.StatusFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	completeKey(t, st, "expired", "v1:a")
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'expired'`)
	completeKey(t, st, "pruned", "v1:a")
	storetest.Exec(t, st, `UPDATE idempotency_records SET status = 'EXPIRED' WHERE idempotency_key = 'pruned'`)
	attempts := storetest.CountClaimAttempts(t, st)

	for _, tc := range []struct {
		key  string
		hash string
		want idem.Outcome
	}{
		{"absent", "v1:a", idem.OutcomeExecute},
		{"running", "v1:a", idem.OutcomeInProgress},
		{"running", "v1:b", idem.OutcomeConflict},
		{"retryable", "v1:a", idem.OutcomeRecover},
		{"expired", "v1:a", idem.OutcomeExpired},
		{"pruned", "v1:b", idem.OutcomeExpired},
	} {
		before := attempts()
		got, err := st.Begin(ctx, beginReq(tc.key, tc.hash))
		if err != nil || got.Outcome != tc.want {
			t.Errorf("%s/%s: Begin = %v, %v; want %v", tc.key, tc.hash, got.Outcome, err, tc.want)
		}
		if n := attempts() - before; n != 1 {
			t.Errorf("%s/%s: %d insert attempts, want 1 (the claim)", tc.key, tc.hash, n)
		}
	}
	if running.Lease.Token != 1 {
		t.Errorf("running lease = %+v", running.Lease)
	}

	// With the fast path off, a replay makes the claim attempt: the trigger
	// sees what the fast path saves.
	completeKey(t, st, "slow", "v1:a")
	plain, err := store.Open(ctx, url, store.Options{NoReplayRead: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	before := attempts()
	if got, err := plain.Begin(ctx, beginReq("slow", "v1:a")); err != nil || got.Outcome != idem.OutcomeReplay {
		t.Fatalf("replay without the fast path = %v, %v", got.Outcome, err)
	}
	if n := attempts() - before; n != 1 {
		t.Errorf("replay without the fast path: %d insert attempts, want 1", n)
	}
	if _, ok, err := plain.ReadSettled(ctx, beginReq("slow", "v1:a")); ok || err != nil {
		t.Errorf("ReadSettled with the fast path off = %v, %v; want false", ok, err)
	}
}

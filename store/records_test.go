package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

func beginReq(key, hash string) idem.BeginRequest {
	return idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "t1", Operation: "op", Key: key},
		RequestHashes: []string{hash}, HashVersion: 1, Owner: "test",
		LockFor: time.Minute, Window: time.Hour,
	}
}

func completion(body string) idem.Completion {
	return idem.Completion{Response: idem.Response{Status: 201, Body: []byte(body), SchemaVersion: "v2",
		Headers: map[string]string{"Content-Type": "application/json"}}, ResourceType: "thing", ResourceID: "x1"}
}

func TestBeginOutcomes(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)

	d, err := st.Begin(ctx, beginReq("k1", "v1:a"))
	if err != nil || d.Outcome != idem.OutcomeExecute {
		t.Fatalf("first Begin = %v, %v; want execute", d.Outcome, err)
	}
	if d.Lease.Token != 1 || d.Record.Status != idem.StatusInProgress || d.Record.Checkpoint != idem.CheckpointReceived {
		t.Fatalf("first claim = token %d, %s/%s; want token 1, IN_PROGRESS/RECEIVED", d.Lease.Token, d.Record.Status, d.Record.Checkpoint)
	}
	for _, tc := range []struct {
		name string
		hash string
		want idem.Outcome
	}{
		{"same command while running", "v1:a", idem.OutcomeInProgress},
		{"different command", "v1:b", idem.OutcomeConflict},
	} {
		got, err := st.Begin(ctx, beginReq("k1", tc.hash))
		if err != nil || got.Outcome != tc.want {
			t.Errorf("%s: Begin = %v, %v; want %v", tc.name, got.Outcome, err, tc.want)
		}
	}
	if err := st.Checkpoint(ctx, d.Lease, cpCreated); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"id":"x1"}`)); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	got, err := st.Begin(ctx, beginReq("k1", "v1:a"))
	if err != nil || got.Outcome != idem.OutcomeReplay {
		t.Fatalf("Begin after complete = %v, %v; want replay", got.Outcome, err)
	}
	if string(got.Record.Response.Body) != `{"id":"x1"}` || got.Record.Response.Headers["Content-Type"] != "application/json" {
		t.Errorf("replayed response = %+v", got.Record.Response)
	}
	if got, _ := st.Begin(ctx, beginReq("k1", "v1:b")); got.Outcome != idem.OutcomeConflict {
		t.Errorf("different command after completion = %v, want conflict", got.Outcome)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"id":"other"}`)); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("second Complete = %v, want ErrFenced", err)
	}
	// Another tenant's identical key is a different scope.
	other := beginReq("k1", "v1:b")
	other.Tenant = "t2"
	if got, err := st.Begin(ctx, other); err != nil || got.Outcome != idem.OutcomeExecute {
		t.Errorf("other tenant Begin = %v, %v; want execute", got.Outcome, err)
	}
	if _, err := st.Get(ctx, idem.Scope{Tenant: "t3", Operation: "op", Key: "k1"}); !errors.Is(err, idem.ErrRecordNotFound) {
		t.Errorf("Get of absent scope = %v, want ErrRecordNotFound", err)
	}
}

func TestBeginRejectsBadRequests(t *testing.T) {
	st, _ := storetest.New(t)
	for name, mutate := range map[string]func(*idem.BeginRequest){
		"empty key":  func(r *idem.BeginRequest) { r.Key = "" },
		"space key":  func(r *idem.BeginRequest) { r.Key = "a b" },
		"no hash":    func(r *idem.BeginRequest) { r.RequestHashes = nil },
		"no window":  func(r *idem.BeginRequest) { r.Window = 0 },
		"no tenant":  func(r *idem.BeginRequest) { r.Tenant = "" },
		"lock <= 0":  func(r *idem.BeginRequest) { r.LockFor = -time.Second },
		"long key":   func(r *idem.BeginRequest) { r.Key = string(make([]byte, 256)) },
		"control ch": func(r *idem.BeginRequest) { r.Key = "a\x01" },
		"long claim": func(r *idem.BeginRequest) { r.ClaimID = strings.Repeat("c", 65) },
	} {
		req := beginReq("k", "v1:a")
		mutate(&req)
		var e *idem.Error
		if _, err := st.Begin(context.Background(), req); !errors.As(err, &e) {
			t.Errorf("%s: Begin error = %v, want *idem.Error", name, err)
		}
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records`); n != 0 {
		t.Errorf("rejected requests wrote %d records", n)
	}
}

// TestConcurrentBeginOneExecutes: 50 concurrent claims of one key, exactly one
// may execute.
func TestConcurrentBeginOneExecutes(t *testing.T) {
	st, _ := storetest.New(t)
	counts := runConcurrently(t, 50, func() (idem.Outcome, error) {
		d, err := st.Begin(context.Background(), beginReq("race", "v1:a"))
		return d.Outcome, err
	})
	if counts[idem.OutcomeExecute] != 1 || counts[idem.OutcomeInProgress] != 49 {
		t.Errorf("outcomes = %v, want 1 execute and 49 in progress", counts)
	}
}

// TestStaleTakeoverExactlyOne: a stale IN_PROGRESS record is recovered by
// exactly one of 20 concurrent retries, and the old owner is fenced out.
func TestStaleTakeoverExactlyOne(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	first, err := st.Begin(ctx, beginReq("stale", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Checkpoint(ctx, first.Lease, cpSent); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = 'stale'`)

	var mu sync.Mutex
	var winner idem.Decision
	counts := runConcurrently(t, 20, func() (idem.Outcome, error) {
		d, err := st.Begin(ctx, beginReq("stale", "v1:a"))
		if d.Outcome == idem.OutcomeRecover {
			mu.Lock()
			winner = d
			mu.Unlock()
		}
		return d.Outcome, err
	})
	if counts[idem.OutcomeRecover] != 1 || counts[idem.OutcomeInProgress] != 19 {
		t.Fatalf("outcomes = %v, want 1 recover and 19 in progress", counts)
	}
	if winner.Lease.Token != first.Lease.Token+1 || winner.Record.Checkpoint != cpSent || winner.Record.Attempts != 2 {
		t.Errorf("winner = token %d checkpoint %s attempts %d; want token %d, PROVIDER_REQUEST_SENT, 2",
			winner.Lease.Token, winner.Record.Checkpoint, winner.Record.Attempts, first.Lease.Token+1)
	}
	// The old owner wakes up: every write it tries is rejected.
	if err := st.Checkpoint(ctx, first.Lease, cpConfirmed); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("old owner Checkpoint = %v, want ErrFenced", err)
	}
	if err := st.Complete(ctx, first.Lease, completion(`{"old":true}`)); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("old owner Complete = %v, want ErrFenced", err)
	}
	if err := st.Complete(ctx, winner.Lease, completion(`{"new":true}`)); err != nil {
		t.Fatalf("new owner Complete: %v", err)
	}
	rec, err := st.Get(ctx, winner.Lease.Scope)
	if err != nil || string(rec.Response.Body) != `{"new":true}` {
		t.Errorf("record = %+v, %v; want the new owner's response", rec, err)
	}
}

func TestFailureClasses(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	cases := []struct {
		status idem.Status
		want   idem.Outcome
	}{
		{idem.StatusFailedReplayable, idem.OutcomeReplay},
		{idem.StatusFailedRetryable, idem.OutcomeRecover},
		{idem.StatusUnknown, idem.OutcomeRecover},
	}
	for i, tc := range cases {
		key := fmt.Sprintf("fail-%d", i)
		d, err := st.Begin(ctx, beginReq(key, "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		resp := &idem.Response{Status: 402, Body: []byte(`{"errorCode":"PAYMENT_DECLINED"}`)}
		if err := st.Fail(ctx, d.Lease, idem.Failure{Status: tc.status, ErrorCode: "X", Response: resp}); err != nil {
			t.Fatalf("Fail(%s): %v", tc.status, err)
		}
		got, err := st.Begin(ctx, beginReq(key, "v1:a"))
		if err != nil || got.Outcome != tc.want {
			t.Errorf("after %s: Begin = %v, %v; want %v", tc.status, got.Outcome, err, tc.want)
		}
	}
	d, _ := st.Begin(ctx, beginReq("bad-fail", "v1:a"))
	if err := st.Fail(ctx, d.Lease, idem.Failure{Status: idem.StatusCompleted}); idem.ErrorCode(err) != idem.ECodeValidationFailed {
		t.Errorf("Fail with COMPLETED = %v, want validation error", err)
	}
}

// TestExpiredKeyIsNewOperation: after the window, the same key with any
// command is a new operation with a new generation.
func TestExpiredKeyIsNewOperation(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	d, _ := st.Begin(ctx, beginReq("old", "v1:a"))
	if err := st.Complete(ctx, d.Lease, completion(`{}`)); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'old'`)
	got, err := st.Begin(ctx, beginReq("old", "v1:b"))
	if err != nil || got.Outcome != idem.OutcomeExpired || !got.ExpiredRetry {
		t.Fatalf("Begin after expiry = %+v, %v; want expired retry", got, err)
	}
	if got.Record.Generation != 1 || got.Record.Response != nil || got.Record.RequestHash != "v1:b" || got.Lease.Token != d.Lease.Token+1 {
		t.Errorf("renewed record = %+v", got.Record)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{}`)); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("previous generation's owner Complete = %v, want ErrFenced", err)
	}
}

// TestTimesComeFromTheStore: record timestamps are the store's now(), so a node
// with a skewed clock cannot make a record look fresh or expired.
func TestTimesComeFromTheStore(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	var dbNow time.Time
	if err := st.Pool().QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	d, err := st.Begin(ctx, beginReq("clock", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	r := d.Record
	if r.CreatedAt.Before(dbNow) || r.CreatedAt.Sub(dbNow) > time.Minute {
		t.Errorf("created_at %v is not the store's time (store said %v)", r.CreatedAt, dbNow)
	}
	if got := r.ExpiresAt.Sub(r.CreatedAt); got != time.Hour {
		t.Errorf("expires_at - created_at = %v, want the 1h window", got)
	}
	if got := r.LockedUntil.Sub(r.CreatedAt); got != time.Minute {
		t.Errorf("locked_until - created_at = %v, want the 1m lock", got)
	}
}

// TestAClaimsRecordIsTheStoredOne: the record a fresh claim answers with
// is the record the store holds, field for field, whether the claim was
// the plain insert (which returns only the statement's time, the record
// built from it) or the insert that also reads; durations that are not
// whole milliseconds are stored truncated, and the answer says so too.
func TestAClaimsRecordIsTheStoredOne(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	utc := func(r *idem.Record) idem.Record {
		c := *r
		c.CreatedAt, c.UpdatedAt, c.ExpiresAt = c.CreatedAt.UTC(), c.UpdatedAt.UTC(), c.ExpiresAt.UTC()
		if c.LockedUntil != nil {
			l := c.LockedUntil.UTC()
			c.LockedUntil = &l
		}
		return c
	}
	check := func(name string, req idem.BeginRequest) {
		t.Helper()
		d, err := st.Begin(ctx, req)
		if err != nil || d.Outcome != idem.OutcomeExecute {
			t.Fatalf("%s: Begin = %v, %v; want execute", name, d.Outcome, err)
		}
		stored, err := st.Get(ctx, req.Scope)
		if err != nil {
			t.Fatalf("%s: Get: %v", name, err)
		}
		if got, want := utc(d.Record), utc(stored); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Begin answered\n%+v\nthe store holds\n%+v", name, got, want)
		}
		if d.Lease != (idem.Lease{Scope: req.Scope, Token: stored.FencingToken, Owner: stored.Owner}) {
			t.Errorf("%s: lease %+v for the stored record %+v", name, d.Lease, stored)
		}
	}
	shapes := func(regime string) {
		plain := beginReq(regime+"-plain", "v1:a")
		check(regime+", plain", plain)
		full := beginReq(regime+"-full", "v2:b")
		full.HashVersion, full.RawHash, full.StartAt, full.HomeRegion = 2, "r1:c", "STARTED", "eu-west"
		full.LockFor, full.Window = 1500*time.Millisecond+700*time.Microsecond, 36*time.Hour+time.Millisecond/3
		full.ClaimID = "claim-" + regime
		check(regime+", every field", full)
	}
	shapes("rare")
	// More than a tenth of the claims finding their key taken: the claim
	// reads in its statement from then on.
	taken := beginReq("taken", "v1:a")
	if _, err := st.Begin(ctx, taken); err != nil {
		t.Fatal(err)
	}
	var sent []string
	for range 10 {
		sent = statements(t, func(ctx context.Context) {
			if d, err := st.Begin(ctx, taken); err != nil || d.Outcome != idem.OutcomeInProgress {
				t.Fatalf("Begin of a taken key = %v, %v; want in progress", d.Outcome, err)
			}
		})
	}
	// The key's record is open, so a transaction decides it after the
	// claim's statement, whichever that was.
	if len(sent) == 0 || sent[0] != "WITH" {
		t.Fatalf("a claim after ten of a taken key sent %v, want the statement that reads (WITH) first", sent)
	}
	shapes("many")
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	st, url := storetest.New(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			other, err := store.Open(context.Background(), url, store.Options{})
			if err != nil {
				errs <- err
				return
			}
			defer other.Close()
			errs <- other.Migrate(context.Background())
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	// storetest.New applied the engine's set and payments'; each version
	// is recorded once, however many processes migrated.
	want := 0
	for _, set := range []store.Migrations{store.EngineMigrations(), payments.Migrations()} {
		files, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		want += len(files)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM schema_migrations`); n != want {
		t.Errorf("schema_migrations has %d rows, want %d", n, want)
	}
}

func TestUnreachableStoreIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.Open(ctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = st.Begin(ctx, beginReq("k", "v1:a"))
	if code := idem.ErrorCode(err); code != idem.ECodeStoreUnavailable {
		t.Errorf("Begin on unreachable store: code %q (%v), want %s", code, err, idem.ECodeStoreUnavailable)
	}
}

// runConcurrently runs fn n times at once (released together) and counts the
// outcomes; any error fails the test.
func runConcurrently(t *testing.T, n int, fn func() (idem.Outcome, error)) map[idem.Outcome]int {
	t.Helper()
	var (
		mu     sync.Mutex
		counts = map[idem.Outcome]int{}
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			o, err := fn()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("concurrent call: %v", err)
				return
			}
			counts[o]++
		})
	}
	close(start)
	wg.Wait()
	return counts
}

// TestExternalFencingTokens: with an external lock service, a takeover needs
// its token, sets the record's token to it, and a lower token never wins.
func TestExternalFencingTokens(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	first, err := st.Begin(ctx, beginReq("ext", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	stale := func() {
		storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = 'ext'`)
	}
	stale()
	req := beginReq("ext", "v1:a")
	req.ExternalFencing = true
	d, err := st.Begin(ctx, req)
	if err != nil || d.Outcome != idem.OutcomeRecover || d.Lease.Token != 0 {
		t.Fatalf("Begin without token = %+v, %v; want recover without a lease", d, err)
	}
	if rec, _ := st.Get(ctx, req.Scope); rec.FencingToken != first.Lease.Token {
		t.Fatalf("record token moved to %d without a lock", rec.FencingToken)
	}
	req.FencingToken = 100
	d, err = st.Begin(ctx, req)
	if err != nil || d.Outcome != idem.OutcomeRecover || d.Lease.Token != 100 {
		t.Fatalf("Begin with token 100 = %+v, %v; want ownership under 100", d, err)
	}
	if err := st.Checkpoint(ctx, first.Lease, cpSent); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("original owner write = %v, want ErrFenced", err)
	}
	stale()
	req.FencingToken = 50
	if _, err := st.Begin(ctx, req); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("takeover with a lower token = %v, want ErrFenced", err)
	}
	req.FencingToken = 200
	d2, err := st.Begin(ctx, req)
	if err != nil || d2.Lease.Token != 200 {
		t.Fatalf("takeover with 200 = %+v, %v", d2, err)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"by":100}`)); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("owner 100 completing after 200 took over = %v, want ErrFenced", err)
	}
	if err := st.Complete(ctx, d2.Lease, completion(`{"by":200}`)); err != nil {
		t.Errorf("owner 200 Complete: %v", err)
	}
}

// TestClosedConnectionIsUnavailable: a connection that a network failure
// already closed is an outage (retry with the same key), not an internal
// error.
func TestClosedConnectionIsUnavailable(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw := conn.Conn().PgConn()
	_ = raw.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT 1`)
	conn.Release()
	if err == nil {
		t.Fatal("a closed connection answered")
	}
	if got := idem.ErrorCode(store.Classify(err)); got != idem.ECodeStoreUnavailable {
		t.Errorf("closed connection error %v classified %s, want %s", err, got, idem.ECodeStoreUnavailable)
	}
}

// Checkpoints an operation of these tests moves through (the engine's own
// are only RECEIVED and COMPLETED).
const (
	cpCreated   idem.Checkpoint = "LOCAL_PAYMENT_CREATED"
	cpSent      idem.Checkpoint = "PROVIDER_REQUEST_SENT"
	cpConfirmed idem.Checkpoint = "PROVIDER_CONFIRMED"
)

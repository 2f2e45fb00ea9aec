package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// TestGroupCommit: completions that queue while a batch is in flight go to
// the store as one fenced statement; each is still fenced by its own lease
// (a stale owner's completion is refused, the others written), two
// completions of one scope never share a batch, and what each caller is
// told matches what its record holds.
func TestGroupCommit(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const n = 6
	leases := make([]idem.Lease, n)
	for i := range n {
		d, err := st.Begin(ctx, beginReq(fmt.Sprintf("g-%d", i), "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = d.Lease
	}
	// Owner 0 lost its record to a takeover: its token is stale.
	stale := leases[0]
	storetest.Exec(t, st, `UPDATE idempotency_records SET fencing_token = fencing_token + 1 WHERE idempotency_key = 'g-0'`)
	// A second completion of g-1 under the same lease: a batch never holds
	// two of one scope, so whichever of the two queued later goes in the
	// next batch, and is refused there (the record is no longer open).
	jobs := append([]idem.Lease{stale}, leases[1:]...)
	jobs = append(jobs, leases[1])

	queued, release := store.HoldGroup(st)
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	var sent []string
	var sentMu sync.Mutex
	for i, lease := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := statements(t, func(ctx context.Context) {
				errs[i] = st.Complete(ctx, lease, completion(fmt.Sprintf(`{"n":%d}`, i)))
			})
			sentMu.Lock()
			sent = append(sent, got...)
			sentMu.Unlock()
		}()
	}
	waitQueued(t, queued, len(jobs), "completions")
	release()
	wg.Wait()

	if !errors.Is(errs[0], idem.ErrFenced) {
		t.Errorf("stale owner's completion = %v, want ErrFenced", errs[0])
	}
	// g-1 had two completions; whichever queued first was written, the
	// other refused. winner is the job whose body g-1 must hold.
	winner := 1
	switch {
	case errs[1] == nil && errors.Is(errs[n], idem.ErrFenced):
	case errs[n] == nil && errors.Is(errs[1], idem.ErrFenced):
		winner = n
	default:
		t.Errorf("the two completions of g-1 = %v and %v; want one written and the other ErrFenced", errs[1], errs[n])
	}
	for i := 1; i < n; i++ {
		job := i
		if i == 1 {
			job = winner
		} else if errs[i] != nil {
			t.Errorf("completion %d = %v, want written", i, errs[i])
		}
		rec, err := st.Get(ctx, leases[i].Scope)
		if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != fmt.Sprintf(`{"n":%d}`, job) || rec.ResourceID != "x1" {
			t.Errorf("record %d = %+v, %v; want the completion of job %d", i, rec, err, job)
		}
	}
	if rec, _ := st.Get(ctx, stale.Scope); rec == nil || rec.Status != idem.StatusInProgress {
		t.Errorf("stale owner's record = %+v, want it left IN_PROGRESS", rec)
	}
	// Two batches: the first with one completion per scope, the second
	// with the repeated scope.
	if len(sent) != 2 || sent[0] != "UPDATE" || sent[1] != "UPDATE" {
		t.Errorf("statements sent %v, want two UPDATEs for %d completions", sent, len(jobs))
	}
}

// TestGroupClaims: claims that queue while a batch is in flight go to the
// store as one statement, and each is decided as it would be alone: free
// keys are claimed, a settled record with the same request is a replay and
// with another a conflict (nothing written for either), an open record is
// decided in a transaction (in progress), and a second claim of a key
// claimed in the batch goes in the next batch and finds it taken.
func TestGroupClaims(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	for _, key := range []string{"gc-done", "gc-other", "gc-open"} {
		d, err := st.Begin(ctx, beginReq(key, "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		if key != "gc-open" {
			if err := st.Complete(ctx, d.Lease, completion(`{"k":"`+key+`"}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	type job struct {
		key, hash string
		want      idem.Outcome
	}
	jobs := []job{
		{"gc-0", "v1:a", idem.OutcomeExecute},
		{"gc-1", "v1:a", idem.OutcomeExecute},
		{"gc-2", "v1:b", idem.OutcomeExecute},
		{"gc-done", "v1:a", idem.OutcomeReplay},
		{"gc-other", "v1:b", idem.OutcomeConflict},
		{"gc-open", "v1:a", idem.OutcomeInProgress},
		{"gc-0", "v1:a", idem.OutcomeInProgress}, // the batch's own claim of gc-0
	}
	queued, release := store.HoldClaims(st)
	got := make([]idem.Decision, len(jobs))
	errs := make([]error, len(jobs))
	var (
		wg     sync.WaitGroup
		sentMu sync.Mutex
		sent   []string
	)
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := beginReq(j.key, j.hash)
			req.RawHash = "r1:" + j.key
			verbs := statements(t, func(ctx context.Context) {
				got[i], errs[i] = st.Begin(ctx, req)
			})
			sentMu.Lock()
			sent = append(sent, verbs...)
			sentMu.Unlock()
		}()
		// The repeated key queues after the first: the batch takes the first.
		waitQueued(t, queued, i+1, "claims")
	}
	release()
	wg.Wait()

	for i, j := range jobs {
		if errs[i] != nil || got[i].Outcome != j.want {
			t.Errorf("claim %d of %s (%s) = %v, %v; want %v", i, j.key, j.hash, got[i].Outcome, errs[i], j.want)
		}
	}
	for i := range 3 {
		if got[i].Lease.Token != 1 || got[i].Record == nil || got[i].Record.RequestHash != jobs[i].hash || got[i].Record.Status != idem.StatusInProgress ||
			got[i].Record.RawHash != "r1:"+jobs[i].key {
			t.Errorf("claim of %s = %+v; want its own IN_PROGRESS record with token 1 and its raw hash", jobs[i].key, got[i])
		}
	}
	if r := got[3].Record; r == nil || string(r.Response.Body) != `{"k":"gc-done"}` {
		t.Errorf("replay of gc-done = %+v; want its stored answer", r)
	}
	if rec, err := st.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: "gc-other"}); err != nil || rec.RequestHash != "v1:a" || rec.Status != idem.StatusCompleted {
		t.Errorf("gc-other after a conflicting claim = %+v, %v; want it unchanged", rec, err)
	}
	// One statement for the batch, one for the repeated key's batch (a
	// batch of one: the plain insert, few claims having found their key
	// taken yet).
	claims := 0
	for _, v := range sent {
		if v == "WITH" || v == "INSERT" {
			claims++
		}
	}
	if claims != 2 {
		t.Errorf("claim statements sent %d (%v), want 2 for %d claims", claims, sent, len(jobs))
	}
	// The group's counts say the same: the three claims and two
	// completions before the batch each alone, the batch of six, the
	// repeated key alone.
	want := []store.GroupStats{
		{Kind: store.GroupClaims, Own: 4, Batched: 6, Batches: 1},
		{Kind: store.GroupOperationClaims},
		{Kind: store.GroupCheckpoints},
		{Kind: store.GroupCompletions, Own: 2},
	}
	if got := st.GroupStats(); !slices.Equal(got, want) {
		t.Errorf("GroupStats = %+v, want %+v", got, want)
	}
}

// TestGroupCheckpoints: checkpoints that queue while a batch is in flight
// go to the store as one fenced statement, each fenced by its own lease: a
// stale owner's checkpoint is refused and its record left as it was, the
// others are written.
func TestGroupCheckpoints(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const n = 4
	leases := make([]idem.Lease, n)
	for i := range n {
		d, err := st.Begin(ctx, beginReq(fmt.Sprintf("c-%d", i), "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = d.Lease
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET fencing_token = fencing_token + 1 WHERE idempotency_key = 'c-0'`)

	queued, release := store.HoldCheckpoints(st)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var sent []string
	var sentMu sync.Mutex
	for i, lease := range leases {
		wg.Go(func() {
			got := statements(t, func(ctx context.Context) { errs[i] = st.Checkpoint(ctx, lease, idem.Checkpoint("STARTED")) })
			sentMu.Lock()
			sent = append(sent, got...)
			sentMu.Unlock()
		})
	}
	waitQueued(t, queued, n, "checkpoints")
	release()
	wg.Wait()

	if !errors.Is(errs[0], idem.ErrFenced) {
		t.Errorf("stale owner's checkpoint = %v, want ErrFenced", errs[0])
	}
	for i := range n {
		rec, err := st.Get(ctx, leases[i].Scope)
		want := idem.Checkpoint("STARTED")
		if i == 0 {
			want = idem.CheckpointReceived
		} else if errs[i] != nil {
			t.Errorf("checkpoint %d = %v, want written", i, errs[i])
		}
		if err != nil || rec.Checkpoint != want || rec.Status != idem.StatusInProgress {
			t.Errorf("record %d = %+v, %v; want IN_PROGRESS at %s", i, rec, err, want)
		}
	}
	if len(sent) != 1 || sent[0] != "UPDATE" {
		t.Errorf("statements sent %v, want one UPDATE for %d checkpoints", sent, n)
	}
}

// waitQueued waits until n writes of a held group are queued (what names
// them in the failure).
func waitQueued(t *testing.T, queued func() int, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); queued() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d %s queued", queued(), n, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupCompletionsKeepNulls: a batch of completions sends its rows as
// arrays; an answer stored by reference (no body, no headers) and one with
// no resource are NULL in the record, as their own statements would leave
// them (cleanup's indexes tell the two kinds of record apart by it), next to
// a stored answer in the same batch.
func TestGroupCompletionsKeepNulls(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	byRef := idem.Completion{Response: idem.Response{Status: 201, SchemaVersion: "v2", ByReference: true},
		ResourceType: "thing", ResourceID: "r1"}
	bare := idem.Completion{Response: idem.Response{Status: 204}}
	jobs := []idem.Completion{byRef, completion(`{"n":1}`), bare}
	leases := make([]idem.Lease, len(jobs))
	for i := range jobs {
		d, err := st.Begin(ctx, beginReq(fmt.Sprintf("null-%d", i), "v1:a"))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = d.Lease
	}
	queued, release := store.HoldGroup(st)
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, c := range jobs {
		wg.Go(func() { errs[i] = st.Complete(ctx, leases[i], c) })
	}
	waitQueued(t, queued, len(jobs), "completions")
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("completion %d = %v", i, err)
		}
	}
	for _, c := range []struct {
		key, where string
	}{
		{"null-0", `response_body IS NULL AND response_headers IS NULL AND response_by_reference AND resource_id = 'r1'`},
		{"null-1", `response_body = '{"n":1}'::BYTEA AND response_headers IS NOT NULL AND NOT response_by_reference AND resource_type = 'thing'`},
		{"null-2", `response_status = 204 AND response_body IS NULL AND response_schema_version IS NULL AND resource_type IS NULL AND resource_id IS NULL`},
	} {
		if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1 AND status = 'COMPLETED' AND `+c.where, c.key); n != 1 {
			t.Errorf("record %s: not %s", c.key, c.where)
		}
	}
}

package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/store"
)

// stuckRecord claims key, checkpoints it past RECEIVED (an owner may have
// acted) and leaves it UNKNOWN_REQUIRES_RECOVERY, as an operation without
// a recovery does when its answer is lost. It returns the owner's lease.
func stuckRecord(t *testing.T, st *store.Store, key string) idem.Lease {
	t.Helper()
	ctx := context.Background()
	d, err := st.Begin(ctx, beginReq(key, "v1:a"))
	if err != nil || d.Outcome != idem.OutcomeExecute {
		t.Fatalf("Begin(%s) = %v, %v", key, d.Outcome, err)
	}
	if err := st.Checkpoint(ctx, d.Lease, cpSent); err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(ctx, d.Lease, idem.Failure{Status: idem.StatusUnknown, ErrorCode: idem.ECodeOutcomeUnknown}); err != nil {
		t.Fatal(err)
	}
	return d.Lease
}

// staleRecord claims key and lets its lock run out (by the store's clock),
// as when its owner died. It returns the owner's lease.
func staleRecord(t *testing.T, st *store.Store, key string) idem.Lease {
	t.Helper()
	d, err := st.Begin(context.Background(), beginReq(key, "v1:a"))
	if err != nil || d.Outcome != idem.OutcomeExecute {
		t.Fatalf("Begin(%s) = %v, %v", key, d.Outcome, err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = $1`, key)
	return d.Lease
}

func settleReq(key string, as idem.Status, resp *idem.Response) store.SettleRequest {
	return store.SettleRequest{Scope: idem.Scope{Tenant: "t1", Operation: "op", Key: key}, As: as, Response: resp,
		By: "alice@ops-host", Reason: "TICKET-7: downstream says it never ran"}
}

// TestSettle: each kind of settlement, of an unknown record and of a stale
// one: a new fencing token that fences the late owner, who and why in the
// record, the checkpoint back at RECEIVED for FAILED_RETRYABLE (the next
// claim takes it over to run it again), the answer replayed otherwise.
func TestSettle(t *testing.T) {
	for name, pooled := range map[string]bool{"direct": false, "through PgBouncer": true} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st, _ := storetest.New(t)
			if pooled {
				st, _ = storetest.NewPooled(t)
			}
			answer := &idem.Response{Status: 201, Body: []byte(`{"id":"tr_1"}`), Headers: map[string]string{"Content-Type": "application/json"}}
			refusal := &idem.Response{Status: 422, Body: []byte(`{"error":"insufficient funds"}`)}
			for _, tc := range []struct {
				key      string
				stale    bool
				as       idem.Status
				resp     *idem.Response
				wantCP   idem.Checkpoint
				wantNext idem.Outcome
			}{
				{"unknown-retry", false, idem.StatusFailedRetryable, nil, idem.CheckpointReceived, idem.OutcomeRecover},
				{"unknown-done", false, idem.StatusCompleted, answer, idem.CheckpointCompleted, idem.OutcomeReplay},
				{"unknown-refused", false, idem.StatusFailedReplayable, refusal, cpSent, idem.OutcomeReplay},
				{"stale-retry", true, idem.StatusFailedRetryable, nil, idem.CheckpointReceived, idem.OutcomeRecover},
				{"stale-done", true, idem.StatusCompleted, answer, idem.CheckpointCompleted, idem.OutcomeReplay},
			} {
				var lease idem.Lease
				if tc.stale {
					lease = staleRecord(t, st, tc.key)
				} else {
					lease = stuckRecord(t, st, tc.key)
				}
				before, err := st.Inspect(ctx, lease.Scope)
				if err != nil || !before.Stuck() {
					t.Fatalf("%s: Inspect = %+v, %v; want a stuck record", tc.key, before, err)
				}
				if page, err := st.ListRecords(ctx, store.RecordFilter{Tenant: "t1", Status: before.Record.Status, After: &idem.Scope{Tenant: "t1", Operation: "op", Key: tc.key[:len(tc.key)-1]}, Limit: 1}); err != nil ||
					len(page.Records) != 1 || page.Records[0].Record.Key != tc.key {
					t.Errorf("%s: ListRecords = %+v, %v", tc.key, page, err)
				}
				got, err := st.Settle(ctx, settleReq(tc.key, tc.as, tc.resp))
				if err != nil {
					t.Fatalf("%s: Settle: %v", tc.key, err)
				}
				rec := got.Record
				if rec.Status != tc.as || rec.Checkpoint != tc.wantCP || rec.FencingToken != lease.Token+1 || rec.LockedUntil != nil ||
					rec.Owner != "settle/alice@ops-host" || rec.Attempts != before.Record.Attempts || rec.ErrorCode != "" {
					t.Errorf("%s: settled record %s at %s, token %d, lock %v, owner %q, attempts %d, error %q", tc.key,
						rec.Status, rec.Checkpoint, rec.FencingToken, rec.LockedUntil, rec.Owner, rec.Attempts, rec.ErrorCode)
				}
				s := got.Settlement
				if s == nil || s.As != tc.as || s.By != "alice@ops-host" || !strings.HasPrefix(s.Reason, "TICKET-7") ||
					s.At.Before(before.StoreTime) || s.At.After(got.StoreTime) {
					t.Errorf("%s: settlement %+v (read at %v, settled by %v)", tc.key, s, before.StoreTime, got.StoreTime)
				}
				if again, err := st.Inspect(ctx, lease.Scope); err != nil || again.Settlement == nil || *again.Settlement != *s {
					t.Errorf("%s: Inspect after Settle: %+v, %v", tc.key, again, err)
				}
				// The late owner is fenced.
				if err := st.Checkpoint(ctx, lease, "LATE"); !errors.Is(err, idem.ErrFenced) {
					t.Errorf("%s: the late owner's Checkpoint = %v, want ErrFenced", tc.key, err)
				}
				if err := st.Complete(ctx, lease, completion(`{"late":true}`)); !errors.Is(err, idem.ErrFenced) {
					t.Errorf("%s: the late owner's Complete = %v, want ErrFenced", tc.key, err)
				}
				next, err := st.Begin(ctx, beginReq(tc.key, "v1:a"))
				if err != nil || next.Outcome != tc.wantNext {
					t.Fatalf("%s: the next claim = %v, %v; want %v", tc.key, next.Outcome, err, tc.wantNext)
				}
				switch tc.wantNext {
				case idem.OutcomeRecover:
					// Taken over at RECEIVED: the engine runs it again.
					if next.Record.Checkpoint != idem.CheckpointReceived || next.Lease.Token != lease.Token+2 {
						t.Errorf("%s: taken over at %s under %d", tc.key, next.Record.Checkpoint, next.Lease.Token)
					}
				case idem.OutcomeReplay:
					r := next.Record.Response
					if r == nil || r.Status != tc.resp.Status || !bytes.Equal(r.Body, tc.resp.Body) || r.Headers["Content-Type"] != tc.resp.Headers["Content-Type"] {
						t.Errorf("%s: replayed %+v, want %+v", tc.key, r, tc.resp)
					}
					if info, _ := st.Inspect(ctx, lease.Scope); info.ResponseBytes != len(tc.resp.Body) || info.Record.Response.Body != nil || info.Record.Response.Headers != nil {
						t.Errorf("%s: inspected answer %+v of %d bytes; want the status and size only", tc.key, info.Record.Response, info.ResponseBytes)
					}
				}
			}
		})
	}
}

// TestSettleRefuses: a record that is not stuck (settled, or IN_PROGRESS
// under a live lock), an absent one, an answer for a record that
// references a resource, and malformed requests are refused, and none of
// them changes the record.
func TestSettleRefuses(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	done, err := st.Begin(ctx, beginReq("done", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, done.Lease, completion(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Begin(ctx, beginReq("live", "v1:a")); err != nil {
		t.Fatal(err)
	}
	settled := stuckRecord(t, st, "twice")
	if _, err := st.Settle(ctx, settleReq("twice", idem.StatusFailedRetryable, nil)); err != nil {
		t.Fatal(err)
	}
	stuckRecord(t, st, "resource")
	storetest.Exec(t, st, `UPDATE idempotency_records SET resource_type = 'thing', resource_id = 'x2' WHERE idempotency_key = 'resource'`)

	answer := &idem.Response{Status: 200, Body: []byte(`{}`)}
	notStuck := func(err error) bool {
		return errors.Is(err, store.ErrNotStuck) && idem.ErrorCode(err) == idem.ECodeRecordNotStuck
	}
	validation := func(err error) bool { return idem.ErrorCode(err) == idem.ECodeValidationFailed }
	for _, tc := range []struct {
		name string
		req  store.SettleRequest
		want func(error) bool
	}{
		{"completed", settleReq("done", idem.StatusFailedRetryable, nil), notStuck},
		{"settled by hand already", settleReq("twice", idem.StatusFailedRetryable, nil), notStuck},
		{"in progress under a live lock", settleReq("live", idem.StatusCompleted, answer), notStuck},
		{"absent", settleReq("nobody", idem.StatusFailedRetryable, nil), func(err error) bool { return errors.Is(err, idem.ErrRecordNotFound) }},
		{"an answer for a record with a resource", settleReq("resource", idem.StatusCompleted, answer), validation},
		{"an answer with FAILED_RETRYABLE", settleReq("resource", idem.StatusFailedRetryable, answer), validation},
		{"COMPLETED without an answer", settleReq("resource", idem.StatusCompleted, nil), validation},
		{"as IN_PROGRESS", settleReq("resource", idem.StatusInProgress, nil), validation},
		{"a status code out of range", settleReq("resource", idem.StatusFailedReplayable, &idem.Response{Status: 99}), validation},
		{"a header with a line break", settleReq("resource", idem.StatusCompleted, &idem.Response{Status: 200, Headers: map[string]string{"X": "a\r\nb"}}), validation},
		{"no reason", func() store.SettleRequest {
			r := settleReq("resource", idem.StatusFailedRetryable, nil)
			r.Reason = ""
			return r
		}(), validation},
		{"nobody", func() store.SettleRequest {
			r := settleReq("resource", idem.StatusFailedRetryable, nil)
			r.By = ""
			return r
		}(), validation},
		{"a control character", func() store.SettleRequest {
			r := settleReq("resource", idem.StatusFailedRetryable, nil)
			r.Reason = "a\x1bb"
			return r
		}(), validation},
		{"an invalid key", settleReq("..", idem.StatusFailedRetryable, nil), func(err error) bool { return idem.ErrorCode(err) == idem.ECodeKeyInvalid }},
	} {
		var before *store.RecordInfo
		if !strings.HasPrefix(tc.name, "an invalid") {
			before, _ = st.Inspect(ctx, tc.req.Scope)
		}
		got, err := st.Settle(ctx, tc.req)
		if !tc.want(err) || got != nil {
			t.Errorf("%s: Settle = %+v, %v (code %s)", tc.name, got, err, idem.ErrorCode(err))
		}
		if before != nil {
			after, _ := st.Inspect(ctx, tc.req.Scope)
			if after.Record.FencingToken != before.Record.FencingToken || after.Record.Status != before.Record.Status || after.Record.UpdatedAt != before.Record.UpdatedAt {
				t.Errorf("%s: the refused settle changed the record: %+v -> %+v", tc.name, before.Record, after.Record)
			}
		}
	}
	// The record that references a resource settles as FAILED_RETRYABLE:
	// its operation writes the answer with its resource on the retry.
	if got, err := st.Settle(ctx, settleReq("resource", idem.StatusFailedRetryable, nil)); err != nil || got.Record.ResourceID != "x2" {
		t.Errorf("FAILED_RETRYABLE of a record with a resource: %+v, %v", got, err)
	}
	if err := st.Complete(ctx, settled, completion(`{}`)); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("the owner of the record settled twice: Complete = %v, want ErrFenced", err)
	}
}

// TestSettleRacesLateOwner: a settle and the late owner's completion, sent
// at once, leave exactly one answer: either the owner completed first and
// the settle is refused (not stuck), or the settle took the record and the
// owner is fenced. Run with -race; many rounds, so that both orders occur.
func TestSettleRacesLateOwner(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	settleAnswer := &idem.Response{Status: 200, Body: []byte(`{"by":"operator"}`)}
	wins := map[string]int{}
	for i := range 40 {
		key := fmt.Sprintf("race-%d", i)
		lease := staleRecord(t, st, key)
		as, resp := idem.StatusCompleted, settleAnswer
		if i%2 == 1 {
			as, resp = idem.StatusFailedRetryable, nil
		}
		var (
			wg                  sync.WaitGroup
			start               = make(chan struct{})
			settleErr, ownerErr error
		)
		wg.Go(func() {
			<-start
			_, settleErr = st.Settle(ctx, settleReq(key, as, resp))
		})
		wg.Go(func() {
			<-start
			ownerErr = st.Complete(ctx, lease, completion(`{"by":"owner"}`))
		})
		close(start)
		wg.Wait()
		rec, err := st.Get(ctx, lease.Scope)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case settleErr == nil && errors.Is(ownerErr, idem.ErrFenced):
			wins["settle"]++
			if rec.Status != as || rec.FencingToken != lease.Token+1 || (resp != nil && string(rec.Response.Body) != `{"by":"operator"}`) {
				t.Errorf("%s: the settle won, the record is %s under %d with %+v", key, rec.Status, rec.FencingToken, rec.Response)
			}
		case ownerErr == nil && errors.Is(settleErr, store.ErrNotStuck):
			wins["owner"]++
			if rec.Status != idem.StatusCompleted || rec.FencingToken != lease.Token || string(rec.Response.Body) != `{"by":"owner"}` {
				t.Errorf("%s: the owner won, the record is %s under %d with %+v", key, rec.Status, rec.FencingToken, rec.Response)
			}
		default:
			t.Errorf("%s: settle %v, owner %v; want exactly one of them to win", key, settleErr, ownerErr)
		}
	}
	t.Logf("wins: %v", wins)
}

// TestListRecords: filters by tenant, operation, status and age (by the
// store's clock), and pages by the (tenant, operation, key) cursor through
// every record exactly once, in order.
func TestListRecords(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	var all []idem.Scope
	for _, tenant := range []string{"t1", "t2"} {
		for _, op := range []string{"op", "other"} {
			for k := range 4 {
				req := beginReq(fmt.Sprintf("k%d", k), "v1:a")
				req.Tenant, req.Operation = tenant, op
				d, err := st.Begin(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, req.Scope)
				if k%2 == 0 {
					if err := st.Fail(ctx, d.Lease, idem.Failure{Status: idem.StatusUnknown}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET created_at = now() - INTERVAL '2 hours' WHERE idempotency_key IN ('k0', 'k1')`)

	// Every record, two a page.
	var got []idem.Scope
	f := store.RecordFilter{Limit: 3}
	for pages := 0; ; pages++ {
		if pages > len(all) {
			t.Fatal("paging does not end")
		}
		page, err := st.ListRecords(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			got = append(got, r.Record.Scope)
		}
		if page.Next == nil {
			break
		}
		if len(page.Records) != 3 || *page.Next != page.Records[2].Record.Scope {
			t.Fatalf("page %d: %d records, next %v", pages, len(page.Records), page.Next)
		}
		f.After = page.Next
	}
	if fmt.Sprint(got) != fmt.Sprint(all) {
		t.Errorf("paged through\n %v\nwant\n %v", got, all)
	}

	keys := func(f store.RecordFilter) string {
		t.Helper()
		page, err := st.ListRecords(ctx, f)
		if err != nil {
			t.Fatalf("ListRecords(%+v): %v", f, err)
		}
		var out []string
		for _, r := range page.Records {
			out = append(out, r.Record.Tenant+"/"+r.Record.Operation+"/"+r.Record.Key)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		f    store.RecordFilter
		want string
	}{
		{store.RecordFilter{Tenant: "t2", Operation: "other"}, "t2/other/k0 t2/other/k1 t2/other/k2 t2/other/k3"},
		{store.RecordFilter{Tenant: "t1", Status: idem.StatusUnknown}, "t1/op/k0 t1/op/k2 t1/other/k0 t1/other/k2"},
		{store.RecordFilter{Operation: "op", Status: idem.StatusInProgress, OlderThan: time.Hour}, "t1/op/k1 t2/op/k1"},
		{store.RecordFilter{Tenant: "t1", OlderThan: 3 * time.Hour}, ""},
		{store.RecordFilter{Status: idem.StatusCompleted}, ""},
		{store.RecordFilter{Tenant: "t2", After: &idem.Scope{Tenant: "t2", Operation: "other", Key: "k2"}}, "t2/other/k3"},
	} {
		if got := keys(tc.f); got != tc.want {
			t.Errorf("ListRecords(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
	for _, f := range []store.RecordFilter{
		{Status: "DONE"}, {Operation: "Op"}, {Tenant: "a b"}, {OlderThan: -time.Second}, {Limit: store.MaxListLimit + 1},
		{After: &idem.Scope{Tenant: "t1", Operation: "op"}},
	} {
		if _, err := st.ListRecords(ctx, f); idem.ErrorCode(err) != idem.ECodeValidationFailed {
			t.Errorf("ListRecords(%+v) = %v, want REQUEST_VALIDATION_FAILED", f, err)
		}
	}
	page, err := st.ListRecords(ctx, store.RecordFilter{Tenant: "t1", Operation: "op", Status: idem.StatusInProgress})
	if err != nil || len(page.Records) != 2 || !page.Records[0].LockHeld() || page.Records[0].Stuck() {
		t.Errorf("IN_PROGRESS records under their lock: %+v, %v", page, err)
	}
}

// TestSettleLogsOneLine: a settle logs one line naming the key by its
// hash, never the key itself, with who settled it and why.
func TestSettleLogsOneLine(t *testing.T) {
	ctx := context.Background()
	_, url := storetest.New(t)
	var buf bytes.Buffer
	st, err := store.Open(ctx, url, store.Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stuckRecord(t, st, "secret-key-42")
	buf.Reset()
	if _, err := st.Settle(ctx, settleReq("secret-key-42", idem.StatusFailedRetryable, nil)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "record settled by hand") || strings.Contains(out, "secret-key-42") ||
		!strings.Contains(out, "key_hash="+telemetry.KeyHash("secret-key-42")) || !strings.Contains(out, "settled_by=alice@ops-host") ||
		!strings.Contains(out, "TICKET-7") || !strings.Contains(out, "as=FAILED_RETRYABLE") {
		t.Errorf("log:\n%s", out)
	}
}

// TestSettlementEndsWithItsGeneration: a key reused after its window is a
// new operation (a new generation of the record); the settlement of the
// old one is not shown as the new one's.
func TestSettlementEndsWithItsGeneration(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.New(t)
	stuckRecord(t, st, "reused")
	if _, err := st.Settle(ctx, settleReq("reused", idem.StatusCompleted, &idem.Response{Status: 201, Body: []byte(`{}`)})); err != nil {
		t.Fatal(err)
	}
	scope := idem.Scope{Tenant: "t1", Operation: "op", Key: "reused"}
	if info, err := st.Inspect(ctx, scope); err != nil || info.Settlement == nil {
		t.Fatalf("Inspect after Settle = %+v, %v; want its settlement", info, err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'reused'`)
	d, err := st.Begin(ctx, beginReq("reused", "v1:b"))
	if err != nil || d.Outcome != idem.OutcomeExpired {
		t.Fatalf("Begin after the window = %v, %v; want expired (a new operation)", d.Outcome, err)
	}
	info, err := st.Inspect(ctx, scope)
	if err != nil || info.Record.Generation != 1 || info.Settlement != nil {
		t.Fatalf("Inspect of the new generation = generation %d, settlement %+v, %v; want generation 1 and none", info.Record.Generation, info.Settlement, err)
	}
}

package answercache_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
	"github.com/idemcoord/idem/tests/commitcut"
)

const (
	tenant = "tenant-a"
	opName = "create_transfer"
)

// lookups counts the answer cache's hits and misses (answers.Metrics).
type lookups struct{ hits, misses atomic.Int64 }

func (l *lookups) Lookup(hit bool) {
	if hit {
		l.hits.Add(1)
	} else {
		l.misses.Add(1)
	}
}
func (l *lookups) Evicted(string)  {}
func (l *lookups) Held(int, int64) {}

// TestUnacknowledgedAnswerIsNotKept loses the answer to the commit of a
// request's completion (the connection closed with the commit in flight,
// or the commit answered 40003, CockroachDB's "result is ambiguous"),
// while the store commits it: the store confirms the completion by reading
// the record back, and the engine answers the execution but keeps nothing
// in memory, so the next replay reads the store (a durable read, which it
// then keeps). A lost answer to the claim's commit, resolved by the claim's
// id, leaves the completion's own commit acknowledged: that answer is kept,
// as is one with nothing lost.
func TestUnacknowledgedAnswerIsNotKept(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  commitcut.Fault
		commit int // which commit of the request (1 the claim, 2 the completion); 0 none
		kept   bool
	}{
		{"completion's answer lost", commitcut.CutCommit, 2, false},
		{"completion answered 40003", commitcut.AmbiguousCommit, 2, false},
		{"claim's answer lost", commitcut.CutCommit, 1, true},
		{"nothing lost", 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			direct, dbURL := storetest.New(t)
			cut := commitcut.New(t, dbURL)
			st, err := store.Open(ctx, cut.URL, store.Options{MaxConns: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var (
				executions atomic.Int32
				counts     lookups
			)
			e := engine.New(st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20, Metrics: &counts}})
			if err := e.Register(engine.Operation{Name: opName, Window: time.Hour, Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
				n := executions.Add(1)
				return engine.Result{Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"},
					Body: fmt.Appendf(nil, `{"id":"tr_%d"}`, n)}}, nil
			}}); err != nil {
				t.Fatal(err)
			}
			h, err := fingerprint.Hashes(opName, map[string]any{"amount": 1})
			if err != nil {
				t.Fatal(err)
			}
			req := engine.Request{Operation: opName, Tenant: tenant, Key: "k", RequestHashes: h}

			var done <-chan struct{}
			if tc.commit > 0 {
				done = cut.ArmFault(tc.fault, tc.commit)
			}
			first, err := e.Do(ctx, req)
			if done != nil {
				select {
				case <-done:
				default:
					t.Fatalf("commit %d was never cut; the test injected nothing", tc.commit)
				}
			}
			if err != nil || first.Replayed || string(first.Response.Body) != `{"id":"tr_1"}` {
				t.Fatalf("Do = %+v, %v; want the one execution's answer", first, err)
			}
			rec, err := direct.Get(ctx, idem.Scope{Tenant: tenant, Operation: opName, Key: "k"})
			if err != nil || rec.Status != idem.StatusCompleted || !bytes.Equal(rec.Response.Body, first.Response.Body) {
				t.Fatalf("record = %+v, %v; want it COMPLETED with the answer given", rec, err)
			}
			if kept := e.Answers().Len() == 1; kept != tc.kept {
				t.Fatalf("answer kept in memory: %v, want %v", kept, tc.kept)
			}

			misses := counts.misses.Load()
			again, err := e.Do(ctx, req)
			if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, first.Response.Body) {
				t.Fatalf("replay = %+v, %v; want the first answer", again, err)
			}
			if fromStore := counts.misses.Load() > misses; fromStore == tc.kept {
				t.Errorf("replay read the store: %v, want %v", fromStore, !tc.kept)
			}
			// Whatever was kept, from the commit or from the replay's durable
			// read, now answers with the store gone.
			st.Close()
			last, err := e.Do(ctx, req)
			if err != nil || !last.Replayed || !bytes.Equal(last.Response.Body, first.Response.Body) {
				t.Errorf("replay with the store closed = %+v, %v; want it from memory", last, err)
			}
			if n := executions.Load(); n != 1 {
				t.Errorf("executions = %d, want 1", n)
			}
		})
	}
}

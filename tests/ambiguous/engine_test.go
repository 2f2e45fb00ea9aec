package ambiguous_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
	"github.com/idemcoord/idem/tests/commitcut"
)

// proxiedStore opens a second store on dbURL's database through a proxy
// that can lose a COMMIT's answer.
func proxiedStore(t *testing.T, dbURL string) (*store.Store, *commitcut.Cut) {
	t.Helper()
	return proxiedStoreConns(t, dbURL, 4)
}

// proxiedStoreConns is proxiedStore with a pool of maxConns connections.
func proxiedStoreConns(t *testing.T, dbURL string, maxConns int32) (*store.Store, *commitcut.Cut) {
	t.Helper()
	cut := commitcut.New(t, dbURL)
	st, err := store.Open(context.Background(), cut.URL, store.Options{MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, cut
}

// TestAmbiguousCommit loses the answer to the COMMIT of the claim (which
// inserts the record at CheckpointStarted, so a fresh request writes no
// checkpoint of its own) and of the completion, while the store commits
// each: the request must still execute exactly once and answer what that
// execution answered, and a retry must replay it.
func TestAmbiguousCommit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit int // which COMMIT of the request loses its answer
	}{
		{"claim", 1},
		{"completion", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			st, cut := proxiedStore(t, dbURL)
			var c counting
			e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
			h := hashes(t, map[string]any{"amount": 1})

			done := cut.Arm(tc.commit)
			ans, err := e.Do(ctx, request("k-"+tc.name, h))
			select {
			case <-done:
			default:
				t.Fatalf("COMMIT %d never lost its answer; the test injected nothing", tc.commit)
			}
			if err != nil {
				t.Fatalf("Do with COMMIT %d cut = %v, want the executed answer", tc.commit, err)
			}
			executedOnce(ctx, t, e, direct, &c, "k-"+tc.name, h, ans)
		})
	}
}

// TestAmbiguousClaimRace loses the answer to a claim's COMMIT while other
// requests with the same key run concurrently: exactly one execution, and
// every request that got an answer got that one.
func TestAmbiguousClaimRace(t *testing.T) {
	ctx := ctxOf(t)
	_, dbURL := storetest.New(t)
	st, cut := proxiedStore(t, dbURL)
	var c counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
	h := hashes(t, map[string]any{"amount": 2})
	done := cut.Arm(1)
	const n = 6
	var (
		wg     sync.WaitGroup
		bodies = make([][]byte, n)
		errs   = make([]error, n)
		ok     atomic.Int32
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request("race", h)
			req.Wait = 30e9
			ans, err := e.Do(ctx, req)
			bodies[i], errs[i] = ans.Response.Body, err
			if err == nil {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	default:
		t.Fatal("no COMMIT lost its answer; the test injected nothing")
	}
	if got := c.n.Load(); got != 1 {
		t.Fatalf("executions = %d, want 1", got)
	}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("request %d: %v, want the one answer", i, errs[i])
			continue
		}
		if string(bodies[i]) != `{"id":"tr_1","token":1}` {
			t.Errorf("request %d answered %s, want the one execution's answer", i, bodies[i])
		}
	}
}

package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/engine/answers"
	"github.com/idemcoord/idem/internal/ctxtime"
	"github.com/idemcoord/idem/internal/fakeclock"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
)

// statements are the store statements fn sent (storetest.Statements).
var statements = storetest.Statements

// manualClock is the engine's Clock over a fakeclock.Manual: the answer
// cache reads it, a wait really sleeps.
type manualClock struct{ *fakeclock.Manual }

func (manualClock) Sleep(ctx context.Context, d time.Duration) error { return ctxtime.Sleep(ctx, d) }

// cacheCounts counts what an answer cache reports (answers.Metrics).
type cacheCounts struct {
	hits, misses, evicted atomic.Int64
	mu                    sync.Mutex
	maxHeld               int64
}

func (c *cacheCounts) Lookup(hit bool) {
	if hit {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
}

func (c *cacheCounts) Evicted(string) { c.evicted.Add(1) }

func (c *cacheCounts) Held(_ int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxHeld = max(c.maxHeld, bytes)
}

// sameAnswer checks that got is want as a client sees it.
func sameAnswer(t *testing.T, what string, got, want engine.Answer) {
	t.Helper()
	if got.Response.Status != want.Response.Status || !maps.Equal(got.Response.Headers, want.Response.Headers) ||
		!bytes.Equal(got.Response.Body, want.Response.Body) || got.Replayed != want.Replayed || got.Status != want.Status ||
		got.Outcome != want.Outcome || got.Response.SchemaVersion != want.Response.SchemaVersion {
		t.Errorf("%s = %d %v %q replayed %v %s %v, want %d %v %q replayed %v %s %v", what,
			got.Response.Status, got.Response.Headers, got.Response.Body, got.Replayed, got.Status, got.Outcome,
			want.Response.Status, want.Response.Headers, want.Response.Body, want.Replayed, want.Status, want.Outcome)
	}
}

// do runs req and returns its answer and the statements it sent.
func do(t *testing.T, e *engine.Engine, req engine.Request) (engine.Answer, []string, error) {
	t.Helper()
	var (
		ans engine.Answer
		err error
	)
	sent := statements(t, func(ctx context.Context) { ans, err = e.Do(ctx, req) })
	return ans, sent, err
}

// answering is an operation whose answer the test chooses per key.
func answering(results map[string]engine.Result) engine.ExecuteFunc {
	return func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		return results[a.Record.Key], nil
	}
}

// TestAnswerCacheReplaysTheStoredAnswer: a replay from memory is the
// replay the store gives, status, headers, body, replayed flag and state
// alike, for an answer the node wrote (its completion's commit
// acknowledged) and for one it read (a replay the store decided), one the
// operation's Replay renders from a referencing record included; and it
// sends no statement.
func TestAnswerCacheReplaysTheStoredAnswer(t *testing.T) {
	st, _ := storetest.New(t)
	results := map[string]engine.Result{
		"completed": {Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json", "Location": "/t/1"},
			Body: []byte(`{"id":"t1"}`), SchemaVersion: "v2"}},
		"rejected": {Status: idem.StatusFailedReplayable, ErrorCode: "INSUFFICIENT_FUNDS",
			Response: idem.Response{Status: 422, Headers: map[string]string{"Content-Type": "application/problem+json"}, Body: []byte(`{"errorCode":"INSUFFICIENT_FUNDS"}`)}},
		"bare":  {Response: idem.Response{Status: 204, Headers: map[string]string{}, Body: []byte{}}},
		"empty": {Response: idem.Response{Status: 200}},
		// The record keeps a reference; Replay renders the answer again.
		"referencing": {Response: idem.Response{Status: 201, Headers: map[string]string{"Location": "/t/ref"}, Body: []byte(`{"id":"ref"}`),
			ByReference: true}, ResourceType: "transfer", ResourceID: "ref"},
	}
	op := engine.Operation{Execute: answering(results), Replay: func(_ context.Context, rec *idem.Record) (idem.Response, error) {
		if !rec.Response.ByReference {
			return *rec.Response, nil
		}
		return idem.Response{Status: rec.Response.Status, Headers: map[string]string{"Location": "/t/" + rec.ResourceID},
			Body: []byte(`{"id":"` + rec.ResourceID + `"}`)}, nil
	}}
	var counts cacheCounts
	cached := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20, Metrics: &counts}}, op)
	plain := newEngine(t, st, engine.Options{}, op)
	reader := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}, op)
	h := hashes(t, map[string]any{"amount": 7})
	for key := range results {
		t.Run(key, func(t *testing.T) {
			first, _, err := do(t, cached, request(key, h))
			if err != nil || !first.Executed {
				t.Fatalf("first Do = %+v, %v; want an execution", first, err)
			}
			hits := counts.hits.Load()
			memo, sent, err := do(t, cached, request(key, h))
			if err != nil || len(sent) != 0 || counts.hits.Load() != hits+1 {
				t.Fatalf("replay from memory = %v, sent %v, hits %d -> %d; want no statement, one hit", err, sent, hits, counts.hits.Load())
			}
			stored, sent, err := do(t, plain, request(key, h))
			if err != nil || !stored.Replayed || len(sent) == 0 {
				t.Fatalf("replay from the store = %+v, %v, sent %v", stored, err, sent)
			}
			sameAnswer(t, "replay from memory", memo, stored)

			// A node that did not write it keeps it from the store's replay.
			read, sent, err := do(t, reader, request(key, h))
			if err != nil || len(sent) == 0 {
				t.Fatalf("first replay at another engine = %v, sent %v; want the store's", err, sent)
			}
			sameAnswer(t, "first replay at another engine", read, stored)
			again, sent, err := do(t, reader, request(key, h))
			if err != nil || len(sent) != 0 {
				t.Fatalf("second replay at another engine = %v, sent %v; want it from memory", err, sent)
			}
			sameAnswer(t, "replay kept from a read", again, stored)
		})
	}
}

// TestAnswerCacheReplaysPaymentsByReference: payments' records reference
// the payment and the replay renders the answer again; the answer kept is
// the rendered one, byte for byte, whether the node wrote or read it.
func TestAnswerCacheReplaysPaymentsByReference(t *testing.T) {
	st, _ := storetest.New(t)
	cache := engine.AnswerCache{Bytes: 1 << 20}
	cached := payments.NewService(st, payments.Config{Region: "test", AnswerCache: cache})
	reader := payments.NewService(st, payments.Config{Region: "test", AnswerCache: cache})
	plain := payments.NewService(st, payments.Config{Region: "test"})
	for _, schema := range []string{"v2", "v3"} {
		t.Run(schema, func(t *testing.T) {
			body := `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"ref-` + schema + `"}`
			req := payments.Request{Tenant: tenant, Key: "pay-" + schema, Body: []byte(body)}
			create := func(svc *payments.Service) (payments.Result, []string) {
				t.Helper()
				var (
					res payments.Result
					err error
				)
				sent := statements(t, func(ctx context.Context) { res, err = svc.Create(ctx, req) })
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				return res, sent
			}
			first, _ := create(cached)
			if first.Replayed || first.Response.Status != 201 {
				t.Fatalf("first Create = %+v", first)
			}
			memo, sent := create(cached)
			stored, storedSent := create(plain)
			if len(sent) != 0 || len(storedSent) == 0 {
				t.Fatalf("replays sent %v from memory, %v from the store; want none, some", sent, storedSent)
			}
			if memo.Response.Status != stored.Response.Status || !maps.Equal(memo.Response.Headers, stored.Response.Headers) ||
				!bytes.Equal(memo.Response.Body, stored.Response.Body) || memo.Replayed != stored.Replayed || !memo.Replayed {
				t.Errorf("replay from memory = %d %v %s %v, want the store's %d %v %s %v", memo.Response.Status, memo.Response.Headers,
					memo.Response.Body, memo.Replayed, stored.Response.Status, stored.Response.Headers, stored.Response.Body, stored.Replayed)
			}
			if !bytes.Equal(memo.Response.Body, first.Response.Body) {
				t.Errorf("replay %s, first answer %s", memo.Response.Body, first.Response.Body)
			}
			if _, sent := create(reader); len(sent) == 0 {
				t.Fatalf("first replay at another node sent nothing")
			}
			read, sent := create(reader)
			if len(sent) != 0 || !bytes.Equal(read.Response.Body, stored.Response.Body) || !maps.Equal(read.Response.Headers, stored.Response.Headers) {
				t.Errorf("replay kept from a read = %s %v, sent %v; want the store's %s from memory", read.Response.Body, read.Response.Headers, sent, stored.Response.Body)
			}
		})
	}
}

// TestAnswerCacheRefusesAReusedKeyFromMemory: a key reused with another
// command is refused from memory, as the store refuses it, with nothing
// sent to the store.
func TestAnswerCacheRefusesAReusedKeyFromMemory(t *testing.T) {
	st, _ := storetest.New(t)
	var c counting
	cached := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}, engine.Operation{Execute: c.execute})
	plain := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
	h, other := hashes(t, map[string]any{"amount": 1}), hashes(t, map[string]any{"amount": 2})
	if _, _, err := do(t, cached, request("reused", h)); err != nil {
		t.Fatal(err)
	}
	got, sent, err := do(t, cached, request("reused", other))
	if idem.ErrorCode(err) != idem.ECodeKeyReused || len(sent) != 0 || got.Outcome != idem.OutcomeConflict || got.Replayed {
		t.Errorf("another command from memory = %+v, %v, sent %v; want %s, outcome conflict, nothing sent", got, err, sent, idem.ECodeKeyReused)
	}
	want, _, werr := do(t, plain, request("reused", other))
	if idem.ErrorCode(werr) != idem.ErrorCode(err) || want.Outcome != got.Outcome || want.Status != got.Status {
		t.Errorf("the store's refusal = %+v, %v; memory's %+v, %v", want, werr, got, err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
	// A hash of an older version of the same command still replays.
	if ans, sent, err := do(t, cached, request("reused", append([]string{"v9:other"}, h...))); err != nil || !ans.Replayed || len(sent) != 0 {
		t.Errorf("the same command under another hash version = %+v, %v, sent %v; want a replay from memory", ans, err, sent)
	}
}

// TestAnswerCacheEndsWithTheWindow: an entry never outlives its record's
// window (nor the retention) on the engine's clock, whether the node wrote
// the answer or read it with part of its window gone.
func TestAnswerCacheEndsWithTheWindow(t *testing.T) {
	st, _ := storetest.New(t)
	h := hashes(t, map[string]any{"amount": 3})
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var c counting
	open := func(opts engine.AnswerCache) (*engine.Engine, *fakeclock.Manual) {
		clk := fakeclock.NewManual(start)
		opts.Bytes = 1 << 20
		return newEngine(t, st, engine.Options{Clock: manualClock{clk}, AnswerCache: opts}, engine.Operation{Execute: c.execute, Window: time.Hour}), clk
	}
	// expect checks a replay of key: from memory (no statement) or not.
	expect := func(e *engine.Engine, key string, memory bool, when string) {
		t.Helper()
		ans, sent, err := do(t, e, request(key, h))
		if err != nil || !ans.Replayed {
			t.Fatalf("%s: replay = %+v, %v", when, ans, err)
		}
		if memory != (len(sent) == 0) {
			t.Errorf("%s: replay sent %v; from memory: %v, want %v", when, sent, len(sent) == 0, memory)
		}
	}

	t.Run("written", func(t *testing.T) {
		e, clk := open(engine.AnswerCache{})
		if _, _, err := do(t, e, request("w", h)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(59 * time.Minute)
		expect(e, "w", true, "59m into a 1h window")
		clk.Advance(time.Minute)
		expect(e, "w", false, "at the window's end")
	})
	t.Run("read", func(t *testing.T) {
		plain := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute, Window: time.Hour})
		if _, err := plain.Do(ctxOf(t), request("r", h)); err != nil {
			t.Fatal(err)
		}
		// 10s of the record's window are left, by the store's clock.
		storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() + INTERVAL '10 seconds' WHERE idempotency_key = 'r'`)
		e, clk := open(engine.AnswerCache{})
		expect(e, "r", false, "first replay")
		clk.Advance(9 * time.Second)
		expect(e, "r", true, "9s later")
		clk.Advance(time.Second)
		expect(e, "r", false, "10s later, the window's end")
	})
	t.Run("retention", func(t *testing.T) {
		e, clk := open(engine.AnswerCache{Retention: time.Minute})
		if _, _, err := do(t, e, request("k", h)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(59 * time.Second)
		expect(e, "k", true, "59s into a 1m retention")
		clk.Advance(time.Second)
		expect(e, "k", false, "at the retention's end")
	})
}

// TestAnswerCacheStaysWithinItsBytes: concurrent requests on ever new
// keys, with answers of every size, never make the cache hold more than
// its bound; it evicts the least recently used, and keeps answering.
func TestAnswerCacheStaysWithinItsBytes(t *testing.T) {
	st, _ := storetest.New(t)
	const bound = 16 << 10
	var counts cacheCounts
	sizes := sync.Map{}
	op := engine.Operation{Execute: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		n, _ := sizes.Load(a.Record.Key)
		return engine.Result{Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "text/plain"},
			Body: bytes.Repeat([]byte{'x'}, n.(int))}}, nil
	}}
	e := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: bound, Metrics: &counts}}, op)
	h := hashes(t, map[string]any{"amount": 5})
	stop := make(chan struct{})
	var (
		sampled atomic.Int64
		watcher sync.WaitGroup
	)
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		for {
			if b := e.Answers().Bytes(); b > sampled.Load() {
				sampled.Store(b)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	const workers, keys = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range keys {
				key := fmt.Sprintf("churn-%d-%d", w, i)
				sizes.Store(key, rng.IntN(3000))
				for range 2 {
					if ans, err := e.Do(ctx, request(key, h)); err != nil || len(ans.Response.Body) == 0 && ans.Response.Status != 201 {
						errs <- fmt.Errorf("%s: %+v, %w", key, ans, err)
						return
					}
				}
				// An older key of this worker: from memory or the store.
				old := fmt.Sprintf("churn-%d-%d", w, rng.IntN(i+1))
				if ans, err := e.Do(ctx, request(old, h)); err != nil || !ans.Replayed {
					errs <- fmt.Errorf("%s again: %+v, %w", old, ans, errors.Join(err, errors.New("not replayed")))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	watcher.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := sampled.Load(); got > bound || counts.maxHeld > bound {
		t.Errorf("the cache held %d bytes (reported %d), above its bound %d", got, counts.maxHeld, bound)
	}
	if counts.evicted.Load() == 0 || counts.hits.Load() == 0 || e.Answers().Len() == 0 {
		t.Errorf("evictions %d, hits %d, entries %d: the churn should have filled, hit and evicted", counts.evicted.Load(), counts.hits.Load(), e.Answers().Len())
	}
	t.Logf("%d hits, %d misses, %d evictions, at most %d of %d bytes, %d entries at the end",
		counts.hits.Load(), counts.misses.Load(), counts.evicted.Load(), sampled.Load(), bound, e.Answers().Len())
}

// TestAnswerCacheOff: without a size the engine keeps nothing and every
// replay reads the store.
func TestAnswerCacheOff(t *testing.T) {
	st, _ := storetest.New(t)
	var c counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
	h := hashes(t, map[string]any{"amount": 9})
	for range 2 {
		if _, _, err := do(t, e, request("off", h)); err != nil {
			t.Fatal(err)
		}
	}
	if _, sent, _ := do(t, e, request("off", h)); len(sent) == 0 || e.Answers() != nil {
		t.Errorf("replay with the cache off sent %v (cache %v); want the store's read", sent, e.Answers())
	}
}

// TestAnswerCacheBegin: the Coordinator's Begin through the engine (what
// the coordination API serves) answers a settled record it read from
// memory, with the record as the store returns it, replay and refusal
// alike; a key in progress is never answered from memory.
func TestAnswerCacheBegin(t *testing.T) {
	st, _ := storetest.New(t)
	e := engine.New(st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}})
	h, other := hashes(t, map[string]any{"amount": 1}), hashes(t, map[string]any{"amount": 2})
	req := func(hs []string) idem.BeginRequest {
		return idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: "b"}, RequestHashes: hs, HashVersion: 2,
			Owner: "o", HomeRegion: "r", LockFor: time.Minute, Window: time.Hour}
	}
	begin := func(hs []string) (idem.Decision, []string) {
		t.Helper()
		var (
			d   idem.Decision
			err error
		)
		sent := statements(t, func(ctx context.Context) { d, err = e.Begin(ctx, req(hs)) })
		if err != nil {
			t.Fatal(err)
		}
		return d, sent
	}
	d, _ := begin(h)
	if d.Outcome != idem.OutcomeExecute {
		t.Fatalf("first Begin = %v", d.Outcome)
	}
	if again, sent := begin(h); again.Outcome != idem.OutcomeInProgress || len(sent) == 0 {
		t.Fatalf("Begin in progress = %v, sent %v; want the store's in_progress", again.Outcome, sent)
	}
	if err := st.Complete(ctxOf(t), d.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("ok")}}); err != nil {
		t.Fatal(err)
	}
	fromStore, sent := begin(h)
	if fromStore.Outcome != idem.OutcomeReplay || len(sent) == 0 {
		t.Fatalf("replay = %v, sent %v; want the store's", fromStore.Outcome, sent)
	}
	for _, tc := range []struct {
		hashes []string
		want   idem.Outcome
	}{{h, idem.OutcomeReplay}, {other, idem.OutcomeConflict}} {
		got, sent := begin(tc.hashes)
		want, err := st.Begin(ctxOf(t), req(tc.hashes))
		if err != nil {
			t.Fatal(err)
		}
		if len(sent) != 0 || got.Outcome != tc.want || want.Outcome != tc.want || got.Lease != want.Lease || got.ExpiredRetry != want.ExpiredRetry {
			t.Errorf("Begin from memory = %v, sent %v; store %v; want %v from memory", got.Outcome, sent, want.Outcome, tc.want)
			continue
		}
		g, w := *got.Record, *want.Record
		if g.Response == nil || w.Response == nil || !bytes.Equal(g.Response.Body, w.Response.Body) || g.Response.Status != w.Response.Status {
			t.Errorf("record's response from memory %+v, the store's %+v", g.Response, w.Response)
		}
		g.Response, w.Response = nil, nil
		if fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("record from memory %+v,\n the store's %+v", g, w)
		}
	}
}

// TestAnswersKeepsItsOwnCopies: what a caller passes to the cache may be
// reused by the caller (a pooled buffer); the entry does not change.
func TestAnswersKeepsItsOwnCopies(t *testing.T) {
	c := answers.New(answers.Options{MaxBytes: 1 << 20})
	body, headers := []byte("first"), map[string]string{"A": "1"}
	scope := idem.Scope{Tenant: "t", Operation: "o", Key: "k"}
	c.Put(answers.KindAnswer, scope, answers.Entry{RequestHash: "v2:x", Status: idem.StatusCompleted,
		Response: idem.Response{Status: 200, Headers: headers, Body: body}, Until: time.Now().Add(time.Hour)})
	copy(body, "XXXXX")
	headers["A"] = "2"
	e, ok := c.Get(answers.KindAnswer, scope)
	if !ok || string(e.Response.Body) != "first" || e.Response.Headers["A"] != "1" {
		t.Errorf("entry = %+v, %v; want the answer as it was put", e, ok)
	}
}

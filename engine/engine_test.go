package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordclient"
	"github.com/idemcoord/idem/coordtest"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fencing"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/fakeclock"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/memcoord"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const (
	tenant = "tenant-a"
	opName = "create_transfer"
)

// coordinator is one idem.Coordinator under test.
type coordinator struct {
	name string
	open func(t *testing.T) fixture
}

// fixture is an opened coordinator and what the tests need beside it.
type fixture struct {
	coord idem.Coordinator
	// target says what the contract suite may expect of coord (its Age is
	// set by suite).
	target coordtest.Target
	// age makes d pass for scope's record (coordtest.Target.Age).
	age func(tb testing.TB, scope idem.Scope, d time.Duration)
	// get reads scope's record.
	get func(tb testing.TB, scope idem.Scope) *idem.Record
}

// suite returns the contract suite's Target for one of its checks.
func (f fixture) suite(t *testing.T) coordtest.Target {
	tg := f.target
	tg.Coordinator = f.coord
	tg.Age = func(s idem.Scope, d time.Duration) { f.age(t, s, d) }
	return tg
}

// record reads key's record (tenant, opName).
func (f fixture) record(t *testing.T, key string) *idem.Record {
	t.Helper()
	return f.get(t, idem.Scope{Tenant: tenant, Operation: opName, Key: key})
}

// stale makes key's lock (of at most a minute) run out.
func (f fixture) stale(t *testing.T, key string) {
	t.Helper()
	f.age(t, idem.Scope{Tenant: tenant, Operation: opName, Key: key}, 2*time.Minute)
}

func storeFixture(st *store.Store) fixture {
	return fixture{
		coord: st,
		age:   func(tb testing.TB, s idem.Scope, d time.Duration) { storetest.Age(tb, st, s, d) },
		get: func(tb testing.TB, s idem.Scope) *idem.Record {
			tb.Helper()
			rec, err := st.Get(context.Background(), s)
			if err != nil {
				tb.Fatalf("get %s: %v", s.Key, err)
			}
			return rec
		},
	}
}

var coordinators = []coordinator{
	{"store", func(t *testing.T) fixture {
		st, _ := storetest.New(t)
		return storeFixture(st)
	}},
	// The store behind PgBouncer in transaction pooling, as most
	// production PostgreSQL is reached.
	{"store behind pgbouncer", func(t *testing.T) fixture {
		st, _ := storetest.NewPooled(t)
		return storeFixture(st)
	}},
	{"client", func(t *testing.T) fixture {
		st, _ := storetest.New(t)
		pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour})
		srv, err := region.NewServer(region.Config{Region: "test", Tokens: map[string]string{"tok-a": tenant},
			Operations: []string{opName, coordtest.Operation, coordtest.OtherOperation}}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(hs.Close)
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		f := storeFixture(st)
		f.coord = &coordclient.Client{BaseURL: hs.URL, Token: "tok-a", HTTP: &http.Client{Transport: tr}}
		// The node serves the token's tenant, whatever a scope names.
		f.target = coordtest.Target{OneTenant: true, NoExternalFencing: true, IgnoresStartAt: true}
		inStore := func(s idem.Scope) idem.Scope { s.Tenant = tenant; return s }
		age, get := f.age, f.get
		f.age = func(tb testing.TB, s idem.Scope, d time.Duration) { age(tb, inStore(s), d) }
		f.get = func(tb testing.TB, s idem.Scope) *idem.Record { return get(tb, inStore(s)) }
		return f
	}},
	{"memory", func(t *testing.T) fixture {
		clock := fakeclock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		c := memcoord.New(memcoord.WithClock(clock.Now))
		return fixture{
			coord: c,
			age:   func(_ testing.TB, _ idem.Scope, d time.Duration) { clock.Advance(d) },
			get: func(tb testing.TB, s idem.Scope) *idem.Record {
				tb.Helper()
				rec, err := c.Get(context.Background(), s)
				if err != nil {
					tb.Fatalf("get %s: %v", s.Key, err)
				}
				return rec
			},
		}
	}},
}

func hashes(t testing.TB, fields map[string]any) []string {
	t.Helper()
	h, err := fingerprint.Hashes(opName, fields)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func ctxOf(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// counting is an operation that counts its executions and answers 201
// with a body naming the execution.
type counting struct {
	n atomic.Int32
}

func (c *counting) execute(_ context.Context, a *engine.Attempt) (engine.Result, error) {
	n := c.n.Add(1)
	return engine.Result{Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"},
		Body: fmt.Appendf(nil, `{"id":"tr_%d","token":%d}`, n, a.Lease.Token)}, ResourceType: "transfer", ResourceID: fmt.Sprint(n)}, nil
}

func newEngine(t *testing.T, c idem.Coordinator, opts engine.Options, op engine.Operation) *engine.Engine {
	t.Helper()
	e := engine.New(c, opts)
	op.Name = opName
	if op.LockFor == 0 {
		op.LockFor = 30 * time.Second
	}
	if op.Window == 0 {
		op.Window = time.Hour
	}
	if err := e.Register(op); err != nil {
		t.Fatal(err)
	}
	return e
}

func request(key string, h []string) engine.Request {
	return engine.Request{Operation: opName, Tenant: tenant, Key: key, RequestHashes: h}
}

// stale makes key's lock run out (store clock).
func stale(t *testing.T, st *store.Store, key string) {
	t.Helper()
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = $1`, key)
}

func record(t *testing.T, st *store.Store, key string) *idem.Record {
	t.Helper()
	rec, err := st.Get(context.Background(), idem.Scope{Tenant: tenant, Operation: opName, Key: key})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

// TestContract runs the Coordinator contract suite (package coordtest) and
// the engine's contract over the in-process store, over the coordination
// API's client and over the in-memory coordinator.
func TestContract(t *testing.T) {
	for _, c := range coordinators {
		t.Run(c.name, func(t *testing.T) {
			t.Run("coordinator", func(t *testing.T) {
				f := c.open(t) // one store for every check: their keys differ
				coordtest.Run(t, f.suite)
			})
			t.Run("replay", func(t *testing.T) { testReplay(t, c) })
			t.Run("conflict", func(t *testing.T) { testConflict(t, c) })
			t.Run("concurrent", func(t *testing.T) { testConcurrent(t, c) })
			t.Run("in progress and wait", func(t *testing.T) { testWait(t, c) })
			t.Run("retryable not replayed", func(t *testing.T) { testRetryable(t, c) })
			t.Run("panic leaves the record for recovery", func(t *testing.T) { testPanic(t, c) })
			t.Run("unknown and recover", func(t *testing.T) { testUnknown(t, c) })
			t.Run("stale at received executes again", func(t *testing.T) { testStaleReceived(t, c) })
			t.Run("expired", func(t *testing.T) { testExpired(t, c) })
			t.Run("bad key", func(t *testing.T) { testBadKey(t, c) })
		})
	}
}

func testReplay(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": fingerprint.Number("10.50")})
	first, err := e.Do(ctx, request("k1", h))
	if err != nil || first.Replayed || first.Outcome != idem.OutcomeExecute || first.Status != idem.StatusCompleted {
		t.Fatalf("first = %+v, %v", first, err)
	}
	second, err := e.Do(ctx, request("k1", h))
	if err != nil || !second.Replayed || second.Outcome != idem.OutcomeReplay {
		t.Fatalf("second = %+v, %v", second, err)
	}
	if string(second.Response.Body) != string(first.Response.Body) || second.Response.Status != 201 ||
		second.Response.Headers["Content-Type"] != "application/json" {
		t.Errorf("replay = %+v, want %+v", second.Response, first.Response)
	}
	if got := op.n.Load(); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
	if rec := f.record(t, "k1"); rec.Status != idem.StatusCompleted || rec.ResourceID != "1" {
		t.Errorf("record = %+v", rec)
	}
}

func testConflict(t *testing.T, c coordinator) {
	coord := c.open(t).coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	ctx := ctxOf(t)
	if _, err := e.Do(ctx, request("k1", hashes(t, map[string]any{"amount": "1"}))); err != nil {
		t.Fatal(err)
	}
	_, err := e.Do(ctx, request("k1", hashes(t, map[string]any{"amount": "2"})))
	if idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Fatalf("different command, same key: %v, want %s", err, idem.ECodeKeyReused)
	}
	if got := op.n.Load(); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}

func testConcurrent(t *testing.T, c coordinator) {
	coord := c.open(t).coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	const n = 50
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		bodies [n]string
		errs   [n]error
	)
	for i := range n {
		wg.Go(func() {
			<-start
			req := request("k-conc", h)
			req.Wait = time.Minute
			ans, err := e.Do(ctx, req)
			bodies[i], errs[i] = string(ans.Response.Body), err
		})
	}
	close(start)
	wg.Wait()
	if got := op.n.Load(); got != 1 {
		t.Fatalf("executions = %d, want exactly 1", got)
	}
	for i := range n {
		if errs[i] != nil || bodies[i] != bodies[0] {
			t.Errorf("request %d = %q, %v; want %q", i, bodies[i], errs[i], bodies[0])
		}
	}
}

func testWait(t *testing.T, c coordinator) {
	coord := c.open(t).coord
	var op counting
	entered, release := make(chan struct{}), make(chan struct{})
	clock := fakeclock.NewStep(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEngine(t, coord, engine.Options{Clock: clock}, engine.Operation{Execute: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
		close(entered)
		<-release
		return op.execute(ctx, a)
	}})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	type result struct {
		ans engine.Answer
		err error
	}
	first := make(chan result, 1)
	go func() {
		ans, err := e.Do(ctx, request("k-wait", h))
		first <- result{ans, err}
	}()
	<-entered
	// No wait: 409 in progress at once.
	if _, err := e.Do(ctx, request("k-wait", h)); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Fatalf("second request while the first runs: %v, want %s", err, idem.ECodeInProgress)
	}
	// With a wait: it polls until the first finishes, then replays.
	waiter := make(chan result, 1)
	go func() {
		req := request("k-wait", h)
		req.Wait = 30 * time.Second
		ans, err := e.Do(ctx, req)
		waiter <- result{ans, err}
	}()
	<-clock.Sleeping // the waiter saw the key in progress and waits
	close(release)
	r1 := <-first
	close(clock.Tick)
	r2 := <-waiter
	if r1.err != nil || r2.err != nil || !r2.ans.Replayed || string(r2.ans.Response.Body) != string(r1.ans.Response.Body) {
		t.Fatalf("first = %+v %v; waiter = %+v %v; want the waiter to replay the first answer", r1.ans, r1.err, r2.ans, r2.err)
	}
	if got := op.n.Load(); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}

func testRetryable(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var n atomic.Int32
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: func(_ context.Context, _ *engine.Attempt) (engine.Result, error) {
		if n.Add(1) == 1 {
			return engine.Result{Response: idem.Response{Status: 503, Body: []byte("busy")}, Status: idem.StatusFailedRetryable, ErrorCode: "DOWNSTREAM_BUSY"}, nil
		}
		return engine.Result{Response: idem.Response{Status: 201, Body: []byte("ok")}}, nil
	}})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	first, err := e.Do(ctx, request("k-r", h))
	if err != nil || first.Response.Status != 503 || first.Status != idem.StatusFailedRetryable {
		t.Fatalf("first = %+v, %v", first, err)
	}
	if rec := f.record(t, "k-r"); rec.Status != idem.StatusFailedRetryable || rec.Checkpoint != idem.CheckpointReceived || rec.Response != nil {
		t.Fatalf("record after a retryable failure = %+v", rec)
	}
	second, err := e.Do(ctx, request("k-r", h))
	if err != nil || second.Replayed || second.Response.Status != 201 || n.Load() != 2 {
		t.Fatalf("retry = %+v, %v (executions %d); want a new execution", second, err, n.Load())
	}
	// A plain error wrapped by Retryable is the same class.
	e2 := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, engine.Retryable(errors.New("downstream refused before acting"))
	}})
	if _, err := e2.Do(ctx, request("k-r2", h)); err == nil || !engine.IsRetryable(err) {
		t.Fatalf("Retryable error = %v", err)
	}
	if rec := f.record(t, "k-r2"); rec.Status != idem.StatusFailedRetryable {
		t.Errorf("record = %s, want FAILED_RETRYABLE", rec.Status)
	}
}

func testPanic(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var executed, recovered atomic.Int32
	e := newEngine(t, coord, engine.Options{}, engine.Operation{
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			executed.Add(1)
			panic("handler bug") // after a side effect, for all the engine knows
		},
		Recover: func(context.Context, *engine.Attempt) (engine.Result, error) {
			recovered.Add(1)
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte("found downstream")}}, nil
		},
	})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	func() {
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("recovered %v, want the handler's panic to go on", p)
			}
		}()
		_, _ = e.Do(ctx, request("k-p", h))
	}()
	// Right after the panic, not after the lock timeout (30s here).
	if rec := f.record(t, "k-p"); rec.Status != idem.StatusUnknown || rec.LockedUntil != nil {
		t.Fatalf("record after a panic = %s (locked until %v), want UNKNOWN_REQUIRES_RECOVERY at once", rec.Status, rec.LockedUntil)
	}
	// The retry is settled by Recover; Execute never runs again.
	ans, err := e.Do(ctx, request("k-p", h))
	if err != nil || ans.Response.Status != 201 || string(ans.Response.Body) != "found downstream" {
		t.Fatalf("retry after panic = %+v, %v", ans, err)
	}
	if executed.Load() != 1 || recovered.Load() != 1 {
		t.Fatalf("after the retry: executed %d, recovered %d; want 1 and 1", executed.Load(), recovered.Load())
	}
}

func testUnknown(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var n atomic.Int32
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
		n.Add(1)
		return engine.Result{}, errors.New("answer lost after the transfer was sent")
	}})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	if _, err := e.Do(ctx, request("k-u", h)); err == nil {
		t.Fatal("Execute's error was not returned")
	}
	if rec := f.record(t, "k-u"); rec.Status != idem.StatusUnknown || rec.Checkpoint != engine.CheckpointStarted {
		t.Fatalf("record = %s at %s, want UNKNOWN at STARTED", rec.Status, rec.Checkpoint)
	}
	// Without Recover, a retry never executes again.
	if _, err := e.Do(ctx, request("k-u", h)); idem.ErrorCode(err) != idem.ECodeOutcomeUnknown || n.Load() != 1 {
		t.Fatalf("retry of an unknown record: %v (executions %d), want %s and no execution", err, n.Load(), idem.ECodeOutcomeUnknown)
	}
	// With Recover, a retry asks downstream and answers what it learns.
	var recovered atomic.Int32
	e2 := newEngine(t, coord, engine.Options{}, engine.Operation{
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			t.Error("executed again")
			return engine.Result{}, nil
		},
		Recover: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
			recovered.Add(1)
			if a.Record.Checkpoint != engine.CheckpointStarted {
				t.Errorf("Recover sees checkpoint %s", a.Record.Checkpoint)
			}
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte("found downstream")}}, nil
		},
	})
	ans, err := e2.Do(ctx, request("k-u", h))
	if err != nil || string(ans.Response.Body) != "found downstream" || recovered.Load() != 1 {
		t.Fatalf("recovering retry = %+v, %v", ans, err)
	}
	if ans, err := e2.Do(ctx, request("k-u", h)); err != nil || !ans.Replayed || recovered.Load() != 1 {
		t.Fatalf("after recovery = %+v, %v; want a replay", ans, err)
	}
}

func testStaleReceived(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	// A claim whose owner died before it started anything.
	if _, err := coord.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: "k-s"},
		RequestHashes: h, HashVersion: 2, Owner: "dead", LockFor: time.Minute, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, request("k-s", h)); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Fatalf("while the dead owner's lock holds: %v, want in progress", err)
	}
	f.stale(t, "k-s")
	ans, err := e.Do(ctx, request("k-s", h))
	if err != nil || ans.Outcome != idem.OutcomeRecover || op.n.Load() != 1 {
		t.Fatalf("after the lock ran out = %+v, %v", ans, err)
	}
}

func testExpired(t *testing.T, c coordinator) {
	f := c.open(t)
	coord := f.coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	if _, err := e.Do(ctx, request("k-e", h)); err != nil {
		t.Fatal(err)
	}
	f.age(t, idem.Scope{Tenant: tenant, Operation: opName, Key: "k-e"}, time.Hour+time.Minute)
	// Past the window the key is a new operation, even with another command.
	ans, err := e.Do(ctx, request("k-e", hashes(t, map[string]any{"amount": "2"})))
	if err != nil || !ans.ExpiredRetry || ans.Replayed || op.n.Load() != 2 {
		t.Fatalf("after the window = %+v, %v", ans, err)
	}
}

func testBadKey(t *testing.T, c coordinator) {
	coord := c.open(t).coord
	var op counting
	e := newEngine(t, coord, engine.Options{}, engine.Operation{Execute: op.execute})
	for _, key := range []string{"", "with space", string(make([]byte, 256))} {
		if _, err := e.Do(ctxOf(t), request(key, hashes(t, nil))); idem.ErrorCode(err) != idem.ECodeKeyInvalid {
			t.Errorf("key %q: %v, want %s", key, err, idem.ECodeKeyInvalid)
		}
	}
	if op.n.Load() != 0 {
		t.Error("executed with a bad key")
	}
}

// TestTenantIsolation: the same key in two tenants is two operations.
func TestTenantIsolation(t *testing.T) {
	st, _ := storetest.New(t)
	var op counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: op.execute})
	h := hashes(t, map[string]any{"amount": "1"})
	for _, tn := range []string{"tenant-a", "tenant-b"} {
		req := request("shared", h)
		req.Tenant = tn
		if ans, err := e.Do(ctxOf(t), req); err != nil || ans.Replayed {
			t.Fatalf("%s: %+v, %v", tn, ans, err)
		}
	}
	if op.n.Load() != 2 {
		t.Errorf("executions = %d, want 2", op.n.Load())
	}
}

// newLocker gives one recoverer its own etcd lease and locker.
func newLocker(t *testing.T, srv *etcdtest.Server) *fencing.Locker {
	t.Helper()
	cli := srv.Client(t)
	lease, err := fencing.Grant(ctxOf(t), cli, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lease.Close(ctx)
	})
	lk, err := fencing.NewLocker(cli, lease, "idem/locks/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return lk
}

// TestRecoverStaleUnderLock: N engines, each with its own etcd lock holder,
// recover the same stale record at once; exactly one acts, under the lock's
// token, and a record still at RECEIVED is released, not executed.
func TestRecoverStaleUnderLock(t *testing.T) {
	st, _ := storetest.New(t)
	srv := etcdtest.Start(t)
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	claim := func(key string, started bool) {
		d, err := st.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: key},
			RequestHashes: h, HashVersion: 2, Owner: "dead", LockFor: time.Minute, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if started {
			if err := st.Checkpoint(ctx, d.Lease, engine.CheckpointStarted); err != nil {
				t.Fatal(err)
			}
		}
		stale(t, st, key)
	}
	claim("k-started", true)
	claim("k-received", false)

	const n = 5
	var (
		recovered atomic.Int32
		tokens    = make(chan int64, n)
		engines   []*engine.Engine
	)
	for range n {
		e := newEngine(t, st, engine.Options{Locker: newLocker(t, srv)}, engine.Operation{
			Recover: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
				recovered.Add(1)
				if err := a.Check(); err != nil {
					t.Errorf("recovering without a valid lock: %v", err)
				}
				tokens <- a.Lease.Token
				return engine.Result{Response: idem.Response{Status: 201, Body: []byte("settled")}}, nil
			},
		})
		engines = append(engines, e)
	}
	var wg sync.WaitGroup
	totals := make([]map[string]int, n)
	for i, e := range engines {
		wg.Go(func() {
			out, err := e.RecoverStale(ctx, 0)
			if err != nil {
				t.Errorf("RecoverStale: %v", err)
			}
			totals[i] = out
		})
	}
	wg.Wait()
	if got := recovered.Load(); got != 1 {
		t.Fatalf("Recover ran %d times, want exactly once", got)
	}
	sum := map[string]int{}
	for _, out := range totals {
		for k, v := range out {
			sum[k] += v
		}
	}
	if sum[engine.RecoveryCompleted] != 1 || sum[engine.RecoveryReleased] != 1 {
		t.Errorf("outcomes = %v, want one completed and one released", sum)
	}
	rec := record(t, st, "k-started")
	if token := <-tokens; rec.Status != idem.StatusCompleted || rec.FencingToken != token || token <= 1 {
		t.Errorf("recovered record = %s with token %d, Recover ran with %d; want COMPLETED under the lock's token", rec.Status, rec.FencingToken, token)
	}
	if rec := record(t, st, "k-received"); rec.Status != idem.StatusFailedRetryable {
		t.Errorf("record at RECEIVED = %s, want FAILED_RETRYABLE", rec.Status)
	}
}

// TestTakeoverUnderLock: a client's retry of a stale record takes it over
// with the etcd lock's token; a second retry while the first holds the
// lock answers in progress.
func TestTakeoverUnderLock(t *testing.T) {
	st, _ := storetest.New(t)
	srv := etcdtest.Start(t)
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	d, err := st.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: "k"},
		RequestHashes: h, HashVersion: 2, Owner: "dead", LockFor: time.Minute, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	stale(t, st, "k")
	entered, release := make(chan int64), make(chan struct{})
	e1 := newEngine(t, st, engine.Options{Locker: newLocker(t, srv)}, engine.Operation{Execute: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		entered <- a.Lease.Token
		<-release
		return engine.Result{Response: idem.Response{Status: 201, Body: []byte("ok")}}, nil
	}})
	var op counting
	e2 := newEngine(t, st, engine.Options{Locker: newLocker(t, srv)}, engine.Operation{Execute: op.execute})
	done := make(chan error, 1)
	go func() {
		_, err := e1.Do(ctx, request("k", h))
		done <- err
	}()
	token := <-entered
	if token <= d.Lease.Token {
		t.Errorf("takeover token %d, want above the dead owner's %d", token, d.Lease.Token)
	}
	if _, err := e2.Do(ctx, request("k", h)); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Errorf("second retry during the takeover: %v, want in progress", err)
	}
	// The dead owner's late write is fenced off.
	if err := st.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201}}); !errors.Is(err, idem.ErrFenced) {
		t.Errorf("dead owner's write = %v, want ErrFenced", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if op.n.Load() != 0 {
		t.Error("the second retry executed")
	}
}

// TestOperationStoresItsOwnOutcome: an operation can keep its own
// unknown-outcome code, write the record's final state itself (with its own
// rows, in its own transaction) and name the recovery outcome counted.
func TestOperationStoresItsOwnOutcome(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	const code = "TRANSFER_OUTCOME_UNKNOWN"
	var locked atomic.Bool
	e := newEngine(t, st, engine.Options{}, engine.Operation{
		UnknownCode: code,
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			return engine.Result{}, errors.New("answer lost after the transfer was sent")
		},
		Recover: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			locked.Store(a.Locked())
			// The operation completes the record itself, as it would in
			// one transaction with its own rows.
			if err := st.Complete(ctx, a.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte("stored by the operation")}}); err != nil {
				return engine.Result{}, err
			}
			return engine.Result{Stored: true, Status: idem.StatusCompleted, RecoveryOutcome: "found",
				Response: idem.Response{Status: 201, Body: []byte("not to be stored")}}, nil
		},
	})
	h := hashes(t, map[string]any{"amount": "1"})
	if _, err := e.Do(ctx, request("k-own", h)); err == nil {
		t.Fatal("Execute's error was not returned")
	}
	if rec := record(t, st, "k-own"); rec.Status != idem.StatusUnknown || rec.ErrorCode != code {
		t.Fatalf("record = %s %s, want UNKNOWN with the operation's code %s", rec.Status, rec.ErrorCode, code)
	}
	out, err := e.RecoverStale(ctx, 10)
	if err != nil || out["found"] != 1 || len(out) != 1 {
		t.Fatalf("RecoverStale = %v, %v; want 1 found", out, err)
	}
	if locked.Load() {
		t.Error("Attempt.Locked without a Locker")
	}
	rec := record(t, st, "k-own")
	if rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "stored by the operation" {
		t.Fatalf("record = %s %q, want COMPLETED with what the operation stored", rec.Status, rec.Response.Body)
	}
	ans, err := e.Do(ctx, request("k-own", h))
	if err != nil || !ans.Replayed || string(ans.Response.Body) != "stored by the operation" {
		t.Fatalf("retry = %+v, %v; want the operation's stored answer replayed", ans, err)
	}

	// Without Recover, a retry answers the operation's code.
	e2 := engine.New(st, engine.Options{})
	if err := e2.Register(engine.Operation{Name: "other_op", UnknownCode: code, Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, errors.New("lost")
	}}); err != nil {
		t.Fatal(err)
	}
	req := engine.Request{Operation: "other_op", Tenant: tenant, Key: "k-code", RequestHashes: h}
	if _, err := e2.Do(ctx, req); err == nil {
		t.Fatal("Execute's error was not returned")
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = 'k-code'`)
	if _, err := e2.Do(ctx, req); idem.ErrorCode(err) != code {
		t.Fatalf("retry of an unknown record = %v, want %s", err, code)
	}
}

// transferClaim is a ClaimFunc that claims in a transaction of its own
// with a row of its own (a transfer): with done, it completes the record in
// that same transaction; otherwise it writes checkpoint DEBITED there and
// leaves the rest to Execute.
func transferClaim(st *store.Store, done bool, amount string) engine.ClaimFunc {
	return func(ctx context.Context, req idem.BeginRequest) (engine.Claim, error) {
		var c engine.Claim
		err := st.ExecTx(ctx, func(tx pgx.Tx) error {
			c = engine.Claim{}
			d, err := store.ClaimTx(ctx, tx, req)
			if err != nil {
				return err
			}
			c.Decision = d
			if d.Outcome != idem.OutcomeExecute {
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO transfers (tenant_id, idempotency_key, amount) VALUES ($1, $2, $3)`, req.Tenant, req.Key, amount); err != nil {
				return err
			}
			if !done {
				c.Progress = "DEBITED"
				return store.CheckpointTx(ctx, tx, d.Lease, c.Progress, 0)
			}
			resp := idem.Response{Status: 201, Body: []byte(`{"amount":"` + amount + `"}`)}
			c.Done = &engine.Result{Stored: true, Status: idem.StatusCompleted, Response: resp}
			return store.CompleteTx(ctx, tx, d.Lease, idem.Completion{Response: resp, ResourceType: "transfer", ResourceID: req.Key})
		})
		return c, err
	}
}

// TestClaimHook: an operation claims in its own transaction with rows of
// its own, finishing there or handing over to Execute without a STARTED
// write; replays go through its Replay; its Execute and Recover see how the
// record was claimed (new, taken over, by the recovery worker).
func TestClaimHook(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	storetest.Exec(t, st, `CREATE TABLE transfers (tenant_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, amount TEXT NOT NULL,
		PRIMARY KEY (tenant_id, idempotency_key))`)
	var (
		op          counting
		bgRecovered atomic.Int32
	)
	e := newEngine(t, st, engine.Options{}, engine.Operation{
		Execute: op.execute,
		Claim:   transferClaim(st, true, "1"),
		Replay: func(_ context.Context, rec *idem.Record) (idem.Response, error) {
			r := *rec.Response
			r.Body = append([]byte("replayed "), r.Body...)
			return r, nil
		},
		Recover: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
			bgRecovered.Add(1)
			if !a.Background || !a.Takeover() || a.Record.Checkpoint != "DEBITED" {
				t.Errorf("worker's Recover: background %v, takeover %v, checkpoint %s; want a background takeover at DEBITED",
					a.Background, a.Takeover(), a.Record.Checkpoint)
			}
			// Nothing it may settle without the client.
			return engine.Result{Status: idem.StatusUnknown}, nil
		},
	})
	h := hashes(t, map[string]any{"amount": "1"})
	transfers := func(key string) int {
		return storetest.Count(t, st, `SELECT count(*) FROM transfers WHERE idempotency_key = $1`, key)
	}

	// Claim and finish in one transaction: Execute never runs.
	ans, err := e.Do(ctx, request("k-one", h))
	if err != nil || ans.Outcome != idem.OutcomeExecute || ans.Status != idem.StatusCompleted || string(ans.Response.Body) != `{"amount":"1"}` {
		t.Fatalf("claim that finishes = %+v, %v", ans, err)
	}
	if op.n.Load() != 0 || transfers("k-one") != 1 {
		t.Fatalf("executions %d, transfers %d; want 0 and 1", op.n.Load(), transfers("k-one"))
	}
	if rec := record(t, st, "k-one"); rec.Status != idem.StatusCompleted || rec.Checkpoint != idem.CheckpointCompleted {
		t.Fatalf("record = %s at %s", rec.Status, rec.Checkpoint)
	}
	ans, err = e.Do(ctx, request("k-one", h))
	if err != nil || !ans.Replayed || string(ans.Response.Body) != `replayed {"amount":"1"}` {
		t.Fatalf("replay = %+v %q, %v; want the Replay hook's answer", ans, ans.Response.Body, err)
	}
	if _, err := e.Do(ctx, request("k-one", hashes(t, map[string]any{"amount": "2"}))); idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Fatalf("other command = %v, want %s", err, idem.ECodeKeyReused)
	}

	// A claim that writes progress of its own: Execute follows without a
	// STARTED write and sees a new key.
	req := request("k-progress", h)
	req.Claim = transferClaim(st, false, "3")
	req.Execute = func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
		if a.Takeover() || a.Outcome != idem.OutcomeExecute || a.Background {
			t.Errorf("Execute of a new key: outcome %v, takeover %v, background %v", a.Outcome, a.Takeover(), a.Background)
		}
		if rec := record(t, st, "k-progress"); rec.Checkpoint != "DEBITED" {
			t.Errorf("checkpoint while Execute runs = %s, want the claim's DEBITED", rec.Checkpoint)
		}
		return engine.Result{Response: idem.Response{Status: 201, Body: []byte("sent")}}, nil
	}
	if ans, err := e.Do(ctx, req); err != nil || string(ans.Response.Body) != "sent" {
		t.Fatalf("claim with progress = %+v, %v", ans, err)
	}
	if rec := record(t, st, "k-progress"); rec.Status != idem.StatusCompleted || transfers("k-progress") != 1 {
		t.Fatalf("record = %s, transfers %d", rec.Status, transfers("k-progress"))
	}

	// The answer is lost after the claim's progress: the worker's Recover
	// runs in the background and leaves it; the client's retry runs the
	// request's Recover, a takeover at DEBITED.
	req = request("k-lost", h)
	req.Claim = transferClaim(st, false, "4")
	req.Execute = func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, errors.New("answer lost")
	}
	if _, err := e.Do(ctx, req); err == nil {
		t.Fatal("Execute's error was not returned")
	}
	out, err := e.RecoverStale(ctx, 10)
	if err != nil || out[engine.RecoveryUnknown] != 1 || bgRecovered.Load() != 1 {
		t.Fatalf("RecoverStale = %v, %v (Recover ran %d times)", out, err, bgRecovered.Load())
	}
	req.Recover = func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		if a.Background || !a.Takeover() || a.Record.Checkpoint != "DEBITED" {
			t.Errorf("client's Recover: background %v, takeover %v, checkpoint %s", a.Background, a.Takeover(), a.Record.Checkpoint)
		}
		return engine.Result{Response: idem.Response{Status: 201, Body: []byte("found")}}, nil
	}
	if ans, err := e.Do(ctx, req); err != nil || ans.Outcome != idem.OutcomeRecover || string(ans.Response.Body) != "found" {
		t.Fatalf("client's retry = %+v, %v", ans, err)
	}
	if bgRecovered.Load() != 1 || transfers("k-lost") != 1 {
		t.Errorf("the operation's Recover ran %d times (want 1, the worker's); transfers %d", bgRecovered.Load(), transfers("k-lost"))
	}
}

// TestStoredErrorAndInProgress: an Execute that stored its own failure
// returns its error as is and the engine writes nothing; an Execute that
// answers in progress (its lock ran out) leaves the record to the owner
// that will finish.
func TestStoredErrorAndInProgress(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	e := newEngine(t, st, engine.Options{}, engine.Operation{})
	h := hashes(t, map[string]any{"amount": "1"})
	req := request("k-stored", h)
	req.Execute = func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
		if err := st.Fail(ctx, a.Lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: "DOWNSTREAM_DOWN"}); err != nil {
			return engine.Result{}, err
		}
		return engine.Result{Stored: true, Status: idem.StatusFailedRetryable}, idem.Errorf("DOWNSTREAM_DOWN", "Downstream is down.")
	}
	ans, err := e.Do(ctx, req)
	if idem.ErrorCode(err) != "DOWNSTREAM_DOWN" || ans.Status != idem.StatusFailedRetryable {
		t.Fatalf("stored failure = %+v, %v; want the operation's error", ans, err)
	}
	// The engine's own release would have put the checkpoint back.
	if rec := record(t, st, "k-stored"); rec.Status != idem.StatusFailedRetryable || rec.ErrorCode != "DOWNSTREAM_DOWN" || rec.Checkpoint != engine.CheckpointStarted {
		t.Fatalf("record = %s %s at %s; want what the operation stored", rec.Status, rec.ErrorCode, rec.Checkpoint)
	}

	req = request("k-lapsed", h)
	req.Execute = func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, idem.Errorf(idem.ECodeInProgress, "This owner's lock ran out.")
	}
	if _, err := e.Do(ctx, req); idem.ErrorCode(err) != idem.ECodeInProgress {
		t.Fatalf("lapsed owner = %v, want in progress", err)
	}
	if rec := record(t, st, "k-lapsed"); rec.Status != idem.StatusInProgress || rec.Checkpoint != engine.CheckpointStarted {
		t.Fatalf("record = %s at %s; want it left IN_PROGRESS for the next owner", rec.Status, rec.Checkpoint)
	}
}

// TestCommitUnknownThenInProgress: a claim whose commit went unanswered
// (store.ErrCommitUnknown) may have written the record that the request's
// next attempt finds in progress: the request's own, which nothing else
// executes, when the claim does not keep the request's claim id (here a
// claim that drops it). The request is answered with the unknown commit's
// error, not IDEMPOTENCY_REQUEST_IN_PROGRESS, which would tell the client
// that another request holds the key (the store-partition chaos scenario
// found such an answer to a key's first call); a client's later retry is
// answered in progress as usual.
func TestCommitUnknownThenInProgress(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	e := newEngine(t, st, engine.Options{}, engine.Operation{
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			t.Error("Execute ran while the key's record was in progress")
			return engine.Result{}, nil
		},
	})
	h := hashes(t, map[string]any{"amount": "1"})
	lost := &idem.Error{Code: idem.ECodeStoreUnavailable, Message: "The store is unavailable.", Err: store.ErrCommitUnknown}
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		key := fmt.Sprintf("k-unknown-%d", wait)
		var claims atomic.Int32
		req := request(key, h)
		req.Wait = wait
		req.RetryOn = func(err error) bool { return errors.Is(err, store.ErrCommitUnknown) }
		req.Claim = func(ctx context.Context, b idem.BeginRequest) (engine.Claim, error) {
			b.ClaimID = "" // each attempt a claim id of its own
			d, err := st.Begin(ctx, b)
			if claims.Add(1) == 1 {
				if err != nil || d.Outcome != idem.OutcomeExecute {
					t.Errorf("first claim = %+v, %v; want the key", d, err)
				}
				// The claim committed; its answer was lost.
				return engine.Claim{}, lost
			}
			return engine.Claim{Decision: d}, err
		}
		_, err := e.Do(ctx, req)
		if !errors.Is(err, store.ErrCommitUnknown) || idem.ErrorCode(err) != idem.ECodeStoreUnavailable {
			t.Errorf("wait %v: answer = %v (%s); want the unknown commit's %s", wait, err, idem.ErrorCode(err), idem.ECodeStoreUnavailable)
		}
		if n := claims.Load(); n < 2 {
			t.Errorf("wait %v: %d claims; want the request attempted again", wait, n)
		}
		if rec := record(t, st, key); rec.Status != idem.StatusInProgress {
			t.Errorf("wait %v: record %s; want the unknown claim's IN_PROGRESS record", wait, rec.Status)
		}

		// Another request of the key is told it is in progress.
		if _, err := e.Do(ctx, request(key, h)); idem.ErrorCode(err) != idem.ECodeInProgress {
			t.Errorf("wait %v: a later request = %v; want %s", wait, err, idem.ECodeInProgress)
		}
	}
}

// TestCommitUnknownThenOwnClaim: with the claim id the engine draws for
// the request (idem.BeginRequest.ClaimID) kept by the claim, as the
// store's Begin keeps it, the attempt after a claim whose commit went
// unanswered is handed back the record that commit stored: Execute runs
// once and the request is answered with its result.
func TestCommitUnknownThenOwnClaim(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	var c counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
	var (
		claims atomic.Int32
		ids    sync.Map
	)
	req := request("k-own", hashes(t, map[string]any{"amount": "1"}))
	req.RetryOn = func(err error) bool { return errors.Is(err, store.ErrCommitUnknown) }
	req.Claim = func(ctx context.Context, b idem.BeginRequest) (engine.Claim, error) {
		ids.Store(b.ClaimID, true)
		d, err := st.Begin(ctx, b)
		if claims.Add(1) == 1 {
			if err != nil || d.Outcome != idem.OutcomeExecute {
				t.Errorf("first claim = %+v, %v; want the key", d, err)
			}
			return engine.Claim{}, &idem.Error{Code: idem.ECodeStoreUnavailable, Message: "The store is unavailable.", Err: store.ErrCommitUnknown}
		}
		return engine.Claim{Decision: d}, err
	}
	ans, err := e.Do(ctx, req)
	if err != nil || ans.Status != idem.StatusCompleted || ans.Replayed || ans.Response.Status != 201 {
		t.Fatalf("answer = %+v, %v; want the request's own execution", ans, err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
	if n := claims.Load(); n != 2 {
		t.Errorf("claims = %d, want the request attempted again once", n)
	}
	distinct := 0
	ids.Range(func(k, _ any) bool {
		if k.(string) == "" {
			t.Error("an attempt had no claim id")
		}
		distinct++
		return true
	})
	if distinct != 1 {
		t.Errorf("the request's attempts had %d claim ids, want one", distinct)
	}
}

// TestClaimHookTakeoverUnderLock: a ClaimFunc that finds a stale record
// with external fencing answers "recover, no lease"; the engine takes the
// scope's lock and claims again with the lock's token.
func TestClaimHookTakeoverUnderLock(t *testing.T) {
	st, _ := storetest.New(t)
	srv := etcdtest.Start(t)
	ctx := ctxOf(t)
	h := hashes(t, map[string]any{"amount": "1"})
	if _, err := st.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: "k"},
		RequestHashes: h, HashVersion: 2, Owner: "dead", LockFor: time.Minute, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	stale(t, st, "k")
	var tokens []int64
	e := newEngine(t, st, engine.Options{Locker: newLocker(t, srv)}, engine.Operation{
		Claim: func(ctx context.Context, req idem.BeginRequest) (engine.Claim, error) {
			tokens = append(tokens, req.FencingToken)
			var d idem.Decision
			err := st.ExecTx(ctx, func(tx pgx.Tx) (err error) {
				d, err = store.ClaimTx(ctx, tx, req)
				return err
			})
			return engine.Claim{Decision: d}, err
		},
		Execute: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
			if !a.Locked() || !a.Takeover() || a.Lease.Token != tokens[len(tokens)-1] {
				t.Errorf("Execute: locked %v, takeover %v, token %d; claims with tokens %v", a.Locked(), a.Takeover(), a.Lease.Token, tokens)
			}
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte("ok")}}, nil
		},
	})
	if _, err := e.Do(ctx, request("k", h)); err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 2 || tokens[0] != 0 || tokens[1] <= 1 {
		t.Fatalf("claims with tokens %v, want one without and one with the lock's token", tokens)
	}
	if rec := record(t, st, "k"); rec.Status != idem.StatusCompleted || rec.FencingToken != tokens[1] {
		t.Errorf("record = %s with token %d, want COMPLETED under %d", rec.Status, rec.FencingToken, tokens[1])
	}
}

// TestReferencingRecord: an Execute whose answer is ByReference leaves a
// record without headers or body; the client still gets the whole first
// answer, a retry gets what the operation's Replay renders from the
// resource, and an operation without a Replay cannot replay such a record
// (an internal error, never an empty body).
func TestReferencingRecord(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := ctxOf(t)
	render := func(id string) idem.Response {
		return idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"},
			Body: fmt.Appendf(nil, `{"id":%q}`, id), SchemaVersion: "v1"}
	}
	execute := func(context.Context, *engine.Attempt) (engine.Result, error) {
		resp := render("tr_1")
		resp.ByReference = true
		return engine.Result{Response: resp, ResourceType: "transfer", ResourceID: "tr_1"}, nil
	}
	e := newEngine(t, st, engine.Options{}, engine.Operation{
		Execute: execute,
		Replay: func(_ context.Context, rec *idem.Record) (idem.Response, error) {
			if !rec.Response.ByReference || rec.Response.Body != nil || rec.Response.Headers != nil {
				return idem.Response{}, fmt.Errorf("replay of %+v: want a reference without body or headers", rec.Response)
			}
			return render(rec.ResourceID), nil
		},
	})
	h := hashes(t, map[string]any{"amount": "1"})
	first, err := e.Do(ctx, request("k-ref", h))
	if err != nil || first.Response.Status != 201 || string(first.Response.Body) != `{"id":"tr_1"}` || first.Response.Headers["Content-Type"] == "" {
		t.Fatalf("first = %+v, %v; want the whole answer", first, err)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'k-ref'
		AND response_by_reference AND response_body IS NULL AND response_headers IS NULL AND response_status = 201
		AND response_schema_version = 'v1' AND resource_id = 'tr_1'`); n != 1 {
		t.Fatal("record: want status, schema version and resource, without body or headers")
	}
	again, err := e.Do(ctx, request("k-ref", h))
	if err != nil || !again.Replayed || string(again.Response.Body) != string(first.Response.Body) || again.Response.Headers["Content-Type"] != "application/json" {
		t.Fatalf("replay = %+v, %v; want the answer rendered again", again, err)
	}

	plain := engine.New(st, engine.Options{})
	if err := plain.Register(engine.Operation{Name: opName, Execute: execute, LockFor: time.Minute, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if ans, err := plain.Do(ctx, request("k-ref", h)); idem.ErrorCode(err) != idem.ECodeInternal || len(ans.Response.Body) != 0 {
		t.Fatalf("replay without a Replay = %+v, %v; want %s", ans, err, idem.ECodeInternal)
	}
}

// TestClientGoneCancelsNothingStarted: a caller whose context ends while
// Execute runs (a client that hung up) does not cut Execute off: it runs
// to its answer with its own deadline (the lock timeout), the answer is
// stored, and the retry replays it.
func TestClientGoneCancelsNothingStarted(t *testing.T) {
	st, _ := storetest.New(t)
	e := newEngine(t, st, engine.Options{}, engine.Operation{LockFor: time.Minute})
	h := hashes(t, map[string]any{"amount": "1"})
	client, hangUp := context.WithCancel(ctxOf(t))
	req := request("k-gone", h)
	var sawCancel atomic.Bool
	req.Execute = func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
		if _, ok := ctx.Deadline(); !ok {
			return engine.Result{}, errors.New("no deadline on Execute")
		}
		hangUp()
		select {
		case <-ctx.Done():
			sawCancel.Store(true)
			return engine.Result{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		return engine.Result{Response: idem.Response{Status: 201, Body: []byte(`{"ok":true}`)}}, nil
	}
	ans, err := e.Do(client, req)
	if err != nil || sawCancel.Load() || !ans.Executed || ans.Status != idem.StatusCompleted {
		t.Fatalf("Do = %+v, %v (Execute cancelled: %v); want it completed", ans, err, sawCancel.Load())
	}
	if rec := record(t, st, "k-gone"); rec.Status != idem.StatusCompleted {
		t.Fatalf("record %s, want COMPLETED", rec.Status)
	}
	req.Execute = func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, errors.New("executed twice")
	}
	if ans, err := e.Do(ctxOf(t), req); err != nil || !ans.Replayed || string(ans.Response.Body) != `{"ok":true}` {
		t.Fatalf("retry = %+v, %v; want the stored answer", ans, err)
	}
}

package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/fakeclock"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

const opName = "create_transfer"

var tokens = map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"}

// fixture is a server with the middleware around one handler.
type fixture struct {
	st     *store.Store
	url    string
	client *http.Client
	calls  atomic.Int32
	reg    *prometheus.Registry
	served chan struct{}
}

// newFixture serves POST /accounts/{account}/transfers with h behind the
// middleware. served receives a value each time the middleware finished.
func newFixture(t *testing.T, h http.HandlerFunc, eopts engine.Options, opts idemhttp.Options) *fixture {
	t.Helper()
	st, _ := storetest.New(t)
	f := &fixture{st: st, reg: prometheus.NewRegistry(), served: make(chan struct{}, 100)}
	e := engine.New(st, eopts)
	opts.Operation = opName
	if opts.Tenant == nil {
		opts.Tenant = idemhttp.BearerTokens(tokens)
	}
	if opts.Window == 0 {
		opts.Window = time.Hour
	}
	metrics, err := idemprom.New(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	opts.Metrics = metrics
	mw, err := idemhttp.Middleware(e, opts)
	if err != nil {
		t.Fatal(err)
	}
	counted := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		h(w, r)
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/transfers", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { f.served <- struct{}{} }()
		counted.ServeHTTP(w, r)
	}))
	hs := httptest.NewUnstartedServer(mux)
	hs.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's panic
	hs.Start()
	t.Cleanup(hs.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	f.url, f.client = hs.URL, &http.Client{Transport: tr}
	return f
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) post(t *testing.T, token, key, body string, extra ...string) answer {
	t.Helper()
	a, err := f.send(context.Background(), token, key, body, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (f *fixture) send(ctx context.Context, token, key, body string, extra ...string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/accounts/acc_1/transfers", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Add(extra[i], extra[i+1])
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

func (f *fixture) record(t *testing.T, tenant, key string) *idem.Record {
	t.Helper()
	rec, err := f.st.Get(context.Background(), idem.Scope{Tenant: tenant, Operation: opName, Key: key})
	if err != nil {
		t.Fatalf("record %s: %v", key, err)
	}
	return rec
}

func errorCode(t *testing.T, a answer) string {
	t.Helper()
	var b struct {
		ErrorCode string `json:"errorCode"`
		Message   string `json:"message"`
	}
	if err := json.Unmarshal([]byte(a.body), &b); err != nil || b.Message == "" || a.header.Get("Content-Type") != idemhttp.ProblemContentType {
		t.Fatalf("error body %q (%s): %v", a.body, a.header.Get("Content-Type"), err)
	}
	return b.ErrorCode
}

// created answers 201 with a body that differs per execution.
func created(n *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := n.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/accounts/%s/transfers/tr_%d", r.PathValue("account"), id))
		w.Header().Set("X-Not-Stored", "1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"tr_%d","echo":%s}`, id, body)
	}
}

func TestReplayIsByteIdentical(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{})
	body := `{"amount": "10.50", "to": "acc_2"}`
	first := f.post(t, "tok-a", "k1", body)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" || first.header.Get("Idempotency-Window") != "3600" ||
		first.header.Get("X-Not-Stored") != "1" {
		t.Fatalf("first = %+v", first)
	}
	// The same command with other spacing and member order is a replay.
	second := f.post(t, "tok-a", "k1", `{"to":"acc_2","amount":"10.50"}`)
	if second.status != 201 || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" ||
		second.header.Get("Location") != first.header.Get("Location") || second.header.Get("Content-Type") != "application/json" ||
		second.header.Get("Idempotency-Window") != "3600" || second.header.Get("X-Not-Stored") != "" {
		t.Fatalf("replay = %+v, want the first answer %+v", second, first)
	}
	if f.calls.Load() != 1 {
		t.Errorf("handler calls = %d, want 1", f.calls.Load())
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "replay")); got != 1 {
		t.Errorf("replay counter = %v, want 1", got)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, outcome string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == "idemhttp_requests_total" && labels["outcome"] == outcome && labels["operation"] == opName {
				c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
				c.Add(m.GetCounter().GetValue())
				return c
			}
		}
	}
	t.Fatalf("no idemhttp_requests_total{outcome=%q}", outcome)
	return nil
}

func TestDifferentBodySameKey(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{})
	f.post(t, "tok-a", "k1", `{"amount":"10.50"}`)
	a := f.post(t, "tok-a", "k1", `{"amount":"10.51"}`)
	if a.status != 409 || errorCode(t, a) != idem.ECodeKeyReused {
		t.Fatalf("different body = %+v", a)
	}
	// A semantic header is part of the command too.
	a = f.post(t, "tok-a", "k1", `{"amount":"10.50"}`, "Api-Version", "2030-01-01")
	if a.status != 409 || errorCode(t, a) != idem.ECodeKeyReused {
		t.Fatalf("different Api-Version = %+v", a)
	}
	if f.calls.Load() != 1 {
		t.Errorf("handler calls = %d, want 1", f.calls.Load())
	}
}

func TestConcurrentIdenticalRequests(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{})
	const count = 50
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		answers [count]answer
		errs    [count]error
	)
	for i := range count {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = f.send(context.Background(), "tok-a", "k-conc", `{"amount":"1"}`, "Prefer", "wait=60")
		})
	}
	close(start)
	wg.Wait()
	if f.calls.Load() != 1 {
		t.Fatalf("handler calls = %d, want exactly 1", f.calls.Load())
	}
	for i := range count {
		if errs[i] != nil || answers[i].status != 201 || answers[i].body != answers[0].body {
			t.Errorf("request %d = %+v, %v", i, answers[i], errs[i])
		}
	}
}

func TestInProgressAndPreferWait(t *testing.T) {
	var n atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	clock := fakeclock.NewStep(time.Unix(0, 0))
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		created(&n)(w, r)
	}, engine.Options{Clock: clock}, idemhttp.Options{})
	first := make(chan answer, 1)
	go func() { first <- f.post(t, "tok-a", "k-w", `{"amount":"1"}`) }()
	<-entered
	a := f.post(t, "tok-a", "k-w", `{"amount":"1"}`)
	if a.status != 409 || errorCode(t, a) != idem.ECodeInProgress || a.header.Get("Retry-After") == "" {
		t.Fatalf("while in progress = %+v, want 409 with Retry-After", a)
	}
	waiter := make(chan answer, 1)
	go func() { waiter <- f.post(t, "tok-a", "k-w", `{"amount":"1"}`, "Prefer", "wait=30") }()
	<-clock.Sleeping
	close(release)
	a1 := <-first
	close(clock.Tick)
	a2 := <-waiter
	if a1.status != 201 || a2.status != 201 || a2.body != a1.body || a2.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first = %+v, waiter = %+v; want the waiter to get the first answer", a1, a2)
	}
}

// TestPanicLeavesTheKeyForRecovery: a handler that panics may have acted
// first, so its key is never executed again: without a Recover every retry
// answers 202 OUTCOME_UNKNOWN, with one the retry gets what it settles.
func TestPanicLeavesTheKeyForRecovery(t *testing.T) {
	var n atomic.Int32
	var verdict atomic.Value
	verdict.Store(idem.StatusUnknown)
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		panic("handler bug")
	}, engine.Options{}, idemhttp.Options{LockFor: time.Hour, Recover: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		s := verdict.Load().(idem.Status)
		return engine.Result{Status: s, Response: idem.Response{Status: 201, Body: []byte("settled downstream")}}, nil
	}})
	if _, err := f.send(context.Background(), "tok-a", "k-p", `{"amount":"1"}`); err == nil {
		t.Fatal("the panicking request got an answer")
	}
	<-f.served
	// At once, not after the hour-long lock timeout.
	if rec := f.record(t, "tenant-a", "k-p"); rec.Status != idem.StatusUnknown || rec.LockedUntil != nil {
		t.Fatalf("record after a panic = %s (locked until %v), want UNKNOWN_REQUIRES_RECOVERY", rec.Status, rec.LockedUntil)
	}
	if a := f.post(t, "tok-a", "k-p", `{"amount":"1"}`); a.status != 202 || errorCode(t, a) != idem.ECodeOutcomeUnknown {
		t.Fatalf("retry while Recover cannot tell = %+v", a)
	}
	verdict.Store(idem.StatusCompleted)
	if a := f.post(t, "tok-a", "k-p", `{"amount":"1"}`); a.status != 201 || a.body != "settled downstream" {
		t.Fatalf("retry once Recover knows = %+v", a)
	}
	if f.calls.Load() != 1 || n.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once", f.calls.Load())
	}
}

func TestDisconnectRecordsTheAnswer(t *testing.T) {
	var n atomic.Int32
	entered := make(chan struct{})
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // the client hung up
		created(&n)(w, r)
	}, engine.Options{}, idemhttp.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.send(ctx, "tok-a", "k-d", `{"amount":"1"}`)
		done <- err
	}()
	<-entered
	cancel()
	<-done
	<-f.served
	if rec := f.record(t, "tenant-a", "k-d"); rec.Status != idem.StatusCompleted {
		t.Fatalf("record after the client left = %s, want COMPLETED as the handler answered", rec.Status)
	}
	if a := f.post(t, "tok-a", "k-d", `{"amount":"1"}`); a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" || f.calls.Load() != 1 {
		t.Fatalf("retry = %+v", a)
	}
}

func TestTenantIsolation(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{})
	a := f.post(t, "tok-a", "shared", `{"amount":"1"}`)
	b := f.post(t, "tok-b", "shared", `{"amount":"1"}`)
	if a.status != 201 || b.status != 201 || b.header.Get("Idempotent-Replayed") != "" || a.body == b.body || f.calls.Load() != 2 {
		t.Fatalf("two tenants = %+v, %+v (calls %d); want two executions", a, b, f.calls.Load())
	}
}

func TestFailureClasses(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		call := n.Add(1)
		switch r.Header.Get("X-Case") {
		case "5xx":
			if call == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, "downstream busy")
				return
			}
		case "4xx":
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprintf(w, `{"rejected":%d}`, call)
			return
		case "classified":
			// A 200 the handler knows is a transient failure.
			idemhttp.Classify(w, idem.StatusFailedRetryable)
		case "unknown":
			// A 500 after a side effect that may have happened.
			idemhttp.Classify(w, idem.StatusUnknown)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "done %d", call)
	}, engine.Options{}, idemhttp.Options{})

	// A 5xx reaches the client but is not replayed: the retry executes.
	if a := f.post(t, "tok-a", "k5", `{}`, "X-Case", "5xx"); a.status != 503 || a.body != "downstream busy" {
		t.Fatalf("5xx = %+v", a)
	}
	if rec := f.record(t, "tenant-a", "k5"); rec.Status != idem.StatusFailedRetryable || rec.Response != nil || rec.ErrorCode != "HTTP_503" {
		t.Fatalf("record of a 5xx = %+v", rec)
	}
	if a := f.post(t, "tok-a", "k5", `{}`, "X-Case", "5xx"); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry of a 5xx = %+v, want a new execution", a)
	}
	// A 4xx is a deterministic rejection: stored and replayed.
	first := f.post(t, "tok-a", "k4", `{}`, "X-Case", "4xx")
	again := f.post(t, "tok-a", "k4", `{}`, "X-Case", "4xx")
	if first.status != 422 || again.status != 422 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("4xx = %+v then %+v", first, again)
	}
	if rec := f.record(t, "tenant-a", "k4"); rec.Status != idem.StatusFailedReplayable || rec.ErrorCode != "HTTP_422" {
		t.Fatalf("record of a 4xx = %s %s, want %s HTTP_422", rec.Status, rec.ErrorCode, idem.StatusFailedReplayable)
	}
	// An unknown outcome's record carries the operation's code for one, as
	// the engine's own unknown outcomes do, not the answer's status.
	if a := f.post(t, "tok-a", "ku", `{}`, "X-Case", "unknown"); a.status != 500 {
		t.Fatalf("unknown = %+v", a)
	}
	if rec := f.record(t, "tenant-a", "ku"); rec.Status != idem.StatusUnknown || rec.ErrorCode != idem.ECodeOutcomeUnknown {
		t.Fatalf("record of an unknown outcome = %s %s, want %s %s", rec.Status, rec.ErrorCode, idem.StatusUnknown, idem.ECodeOutcomeUnknown)
	}
	// Classify overrides the status's default class.
	f.post(t, "tok-a", "kc", `{}`, "X-Case", "classified")
	if rec := f.record(t, "tenant-a", "kc"); rec.Status != idem.StatusFailedRetryable {
		t.Fatalf("classified record = %s", rec.Status)
	}
}

// TestReplayHeaders: by default Content-Type, Content-Encoding (the
// stored bytes keep their encoding) and Location are stored and replayed;
// Options.ReplayHeaders replaces them, in any spelling, and the record
// keeps canonical names. Set-Cookie is stored only when named.
func TestReplayHeaders(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Encoding", "br") // a client's transport leaves it alone
		h.Set("Location", "/transfers/tr_1")
		h.Set("X-Request-Id", "req-1")
		h.Set("Set-Cookie", "session=s1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte{0x8b, 0x01, 0x80, 0x03})
	}
	for _, c := range []struct {
		stored []string
		want   map[string]string
	}{
		{nil, map[string]string{"Content-Type": "application/json", "Content-Encoding": "br", "Location": "/transfers/tr_1"}},
		{[]string{"x-request-id", "CONTENT-TYPE", "X-Absent"}, map[string]string{"X-Request-Id": "req-1", "Content-Type": "application/json"}},
	} {
		f := newFixture(t, handler, engine.Options{}, idemhttp.Options{ReplayHeaders: c.stored})
		first := f.post(t, "tok-a", "kh", `{}`)
		replay := f.post(t, "tok-a", "kh", `{}`)
		if rec := f.record(t, "tenant-a", "kh"); rec.Response == nil || !maps.Equal(rec.Response.Headers, c.want) {
			t.Errorf("ReplayHeaders %q: record's headers %v, want %v", c.stored, rec.Response, c.want)
		}
		if replay.header.Get("Idempotent-Replayed") != "true" || replay.body != first.body || replay.header.Get("Set-Cookie") != "" {
			t.Errorf("ReplayHeaders %q: replay %+v of %+v", c.stored, replay, first)
		}
		for name, v := range c.want {
			if got := replay.header.Get(name); got != v {
				t.Errorf("ReplayHeaders %q: replayed %s %q, want %q", c.stored, name, got, v)
			}
		}
	}
}

func TestBadRequestsAreNever5xx(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{MaxBodyBytes: 1024})
	cases := []struct {
		name, token, key, body string
		extra                  []string
		status                 int
		code                   string
	}{
		{"no key", "tok-a", "", `{}`, nil, 400, idem.ECodeKeyMissing},
		{"key with a space", "tok-a", "a b", `{}`, nil, 400, idem.ECodeKeyInvalid},
		{"key too long", "tok-a", strings.Repeat("k", 256), `{}`, nil, 400, idem.ECodeKeyInvalid},
		{"key twice", "tok-a", "k1", `{}`, []string{"Idempotency-Key", "k2"}, 400, idem.ECodeKeyInvalid},
		{"unknown token", "tok-x", "k1", `{}`, nil, 401, idem.ECodeUnauthenticated},
		{"not JSON", "tok-a", "k1", `amount=1`, nil, 422, idem.ECodeRequestMalformed},
		{"duplicate member", "tok-a", "k1", `{"a":1,"a":2}`, nil, 422, idem.ECodeRequestMalformed},
		{"inexact number", "tok-a", "k1", `{"a":9007199254740993}`, nil, 422, idem.ECodeValidationFailed},
		{"invalid UTF-8", "tok-a", "k1", "{\"a\":\"\xff\"}", nil, 422, idem.ECodeRequestMalformed},
		{"not an object", "tok-a", "k1", `[1]`, nil, 422, idem.ECodeValidationFailed},
		{"too large", "tok-a", "k1", `{"a":"` + strings.Repeat("x", 2048) + `"}`, nil, 413, idem.ECodeBodyTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := f.post(t, c.token, c.key, c.body, c.extra...)
			if a.status != c.status || errorCode(t, a) != c.code {
				t.Errorf("answer = %d %s, want %d %s", a.status, a.body, c.status, c.code)
			}
		})
	}
	if f.calls.Load() != 0 {
		t.Errorf("handler calls = %d, want 0", f.calls.Load())
	}
	if got := storetest.Count(t, f.st, `SELECT count(*) FROM idempotency_records`); got != 0 {
		t.Errorf("records = %d, want none for refused requests", got)
	}
}

func TestOversizedAnswer(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 100))
	}, engine.Options{}, idemhttp.Options{MaxResponseBody: 64})
	a := f.post(t, "tok-a", "k-big", `{}`)
	if a.status != 500 || errorCode(t, a) != idem.ECodeResponseTooLarge {
		t.Fatalf("oversized answer = %+v, want 500 %s", a, idem.ECodeResponseTooLarge)
	}
	if rec := f.record(t, "tenant-a", "k-big"); rec.Status != idem.StatusUnknown || rec.ErrorCode != idem.ECodeResponseTooLarge {
		t.Fatalf("record = %s %s, want UNKNOWN_REQUIRES_RECOVERY", rec.Status, rec.ErrorCode)
	}
	// The handler acted once; a retry must not act again.
	a = f.post(t, "tok-a", "k-big", `{}`)
	if a.status != 202 || errorCode(t, a) != idem.ECodeOutcomeUnknown || a.header.Get("Retry-After") == "" || n.Load() != 1 {
		t.Fatalf("retry = %+v (calls %d), want 202 %s and no execution", a, n.Load(), idem.ECodeOutcomeUnknown)
	}
}

// TestPassThrough: an answer the handler passes through reaches the client
// in full, as written, and is settled without its body: the retry answers
// 410 IDEMPOTENCY_RESPONSE_NOT_STORED without running the handler, and a
// retryable one (5xx) runs again, as a buffered one does.
func TestPassThrough(t *testing.T) {
	var n atomic.Int32
	big := strings.Repeat("x", 100)
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		idemhttp.PassThrough(w)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Location", "/accounts/acc_1/transfers/tr_1")
		status := http.StatusCreated
		if r.Header.Get("X-Fail") != "" {
			status = http.StatusBadGateway
		}
		w.WriteHeader(status)
		for i := 0; i < len(big); i += 10 {
			_, _ = io.WriteString(w, big[i:i+10])
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}
	}, engine.Options{}, idemhttp.Options{MaxResponseBody: 64})
	first := f.post(t, "tok-a", "k-pass", `{}`)
	if first.status != 201 || first.body != big || first.header.Get("Location") == "" || first.header.Get("Idempotency-Window") == "" {
		t.Fatalf("first = %d %q %v", first.status, first.body, first.header)
	}
	rec := f.record(t, "tenant-a", "k-pass")
	if rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 ||
		rec.Response.SchemaVersion != idemhttp.NotStoredSchema || len(rec.Response.Body) != 0 {
		t.Fatalf("record = %s %+v, want COMPLETED, 201, %s and no body", rec.Status, rec.Response, idemhttp.NotStoredSchema)
	}
	for range 2 {
		a := f.post(t, "tok-a", "k-pass", `{}`)
		if a.status != http.StatusGone || errorCode(t, a) != idem.ECodeResponseNotStored || a.header.Get("Retry-After") != "" {
			t.Fatalf("retry = %+v, want 410 %s", a, idem.ECodeResponseNotStored)
		}
	}
	if n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", n.Load())
	}
	for i := range 2 {
		if a := f.post(t, "tok-a", "k-pass-5xx", `{}`, "X-Fail", "1"); a.status != 502 || a.body != big {
			t.Fatalf("retryable pass-through %d = %d %q", i, a.status, a.body)
		}
	}
	if n.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3 (a retryable answer executes again)", n.Load())
	}
}

func TestOptionsNeedATenantSource(t *testing.T) {
	st, _ := storetest.New(t)
	e := engine.New(st, engine.Options{})
	if _, err := idemhttp.Middleware(e, idemhttp.Options{Operation: opName}); err == nil {
		t.Error("Middleware without Tenant succeeded")
	}
	if _, err := idemhttp.Middleware(e, idemhttp.Options{Tenant: idemhttp.BearerTokens(tokens)}); err == nil {
		t.Error("Middleware without Operation succeeded")
	}
}

// TestRegisteredRefusesWhatItWouldIgnore: when the engine has the
// operation already, its registration decides the window, the lock timeout
// and Recover; setting one of them to another value on the middleware is
// an error, not a silent no-op. Two routes share one operation.
func TestRegisteredRefusesWhatItWouldIgnore(t *testing.T) {
	st, _ := storetest.New(t)
	e := engine.New(st, engine.Options{})
	if err := e.Register(engine.Operation{Name: opName, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	recover := func(context.Context, *engine.Attempt) (engine.Result, error) { return engine.Result{}, nil }
	for name, opts := range map[string]idemhttp.Options{
		"Window":  {Window: time.Minute},
		"LockFor": {LockFor: time.Second},
		"Recover": {Recover: recover},
	} {
		opts.Operation, opts.Tenant = opName, idemhttp.BearerTokens(tokens)
		if _, err := idemhttp.Middleware(e, opts); err == nil {
			t.Errorf("a registered operation with another %s succeeded", name)
		}
	}
	for _, route := range []string{"POST /a", "POST /b"} {
		if _, err := idemhttp.Middleware(e, idemhttp.Options{Operation: opName, Tenant: idemhttp.BearerTokens(tokens), Window: time.Hour}); err != nil {
			t.Errorf("route %s on the registered operation, with its own window: %v", route, err)
		}
	}
	// Two routes of an operation the middleware registers share it too.
	for _, route := range []string{"POST /c", "POST /d"} {
		if _, err := idemhttp.Middleware(e, idemhttp.Options{Operation: "shared_op", Tenant: idemhttp.BearerTokens(tokens)}); err != nil {
			t.Errorf("route %s of shared_op: %v", route, err)
		}
	}
}

func TestOversizedAnswerRecovered(t *testing.T) {
	var n atomic.Int32
	var verdict atomic.Value
	verdict.Store(idem.StatusUnknown)
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 100))
	}, engine.Options{}, idemhttp.Options{MaxResponseBody: 64, Recover: func(_ context.Context, a *engine.Attempt) (engine.Result, error) {
		s := verdict.Load().(idem.Status)
		return engine.Result{Status: s, Response: idem.Response{Status: 200, Body: []byte("settled downstream")}}, nil
	}})
	if a := f.post(t, "tok-a", "k-big", `{}`); a.status != 500 {
		t.Fatalf("oversized = %+v", a)
	}
	// Recover cannot tell yet: the client hears that, not an empty 200.
	if a := f.post(t, "tok-a", "k-big", `{}`); a.status != 202 || errorCode(t, a) != idem.ECodeOutcomeUnknown {
		t.Fatalf("retry while Recover cannot tell = %+v", a)
	}
	verdict.Store(idem.StatusCompleted)
	if a := f.post(t, "tok-a", "k-big", `{}`); a.status != 200 || a.body != "settled downstream" {
		t.Fatalf("retry once Recover knows = %+v", a)
	}
	if a := f.post(t, "tok-a", "k-big", `{}`); a.body != "settled downstream" || a.header.Get("Idempotent-Replayed") != "true" || n.Load() != 1 {
		t.Fatalf("after recovery = %+v (calls %d)", a, n.Load())
	}
}

// TestCommandStoredAndHooks: an operation that owns more of its path (as
// a node's own operations do) parses its own command (Hooks.Command: its fields and a
// value for the handler), records its result itself (Stored: the
// middleware writes nothing to the record) and answers with the node's
// table of errors, extended with a code of its own, and metrics (Errors,
// Observe).
func TestCommandStoredAndHooks(t *testing.T) {
	var (
		st       *store.Store
		observed []string
		mu       sync.Mutex
	)
	table, err := idemhttp.DefaultErrors().With(map[string]idemhttp.ErrorClass{
		"AMOUNT_NOT_POSITIVE": {Status: http.StatusTeapot, Title: "Amount not positive"},
	})
	if err != nil {
		t.Fatal(err)
	}
	opts := idemhttp.Options{
		Errors: table,
	}
	opts.Hooks = &idemhttp.Hooks{
		Command: func(r *http.Request, body []byte) (idemhttp.Command, error) {
			var c struct {
				Amount int `json:"amount"`
			}
			if err := json.Unmarshal(body, &c); err != nil || c.Amount <= 0 {
				return idemhttp.Command{}, idem.Errorf("AMOUNT_NOT_POSITIVE", "The amount must be positive.")
			}
			return idemhttp.Command{Fields: map[string]any{"amount": int64(c.Amount)}, Value: c.Amount}, nil
		},
		Observe: func(r *http.Request, ans engine.Answer, err error, _ time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			observed = append(observed, fmt.Sprintf("%s/%v/%s", ans.Outcome, ans.Replayed, idem.ErrorCode(err)))
		},
	}
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		amount, _ := idemhttp.ValueFrom(r.Context()).(int)
		a := idemhttp.AttemptFrom(r.Context())
		resp := idem.Response{Status: http.StatusCreated, Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Appendf(nil, `{"moved":%d}`, amount)}
		// The operation's own write: the completion, as it would commit it
		// with its domain rows.
		if err := st.Complete(r.Context(), a.Lease, idem.Completion{Response: resp}); err != nil {
			idemhttp.Fail(w, err)
			return
		}
		idemhttp.Stored(w, idem.StatusCompleted)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	}, engine.Options{}, opts)
	st = f.st

	first := f.post(t, "tok-a", "k-own", `{"amount": 7}`)
	if first.status != 201 || first.body != `{"moved":7}` {
		t.Fatalf("first = %+v, want 201 with the handler's body", first)
	}
	// Re-serialised, the same command: the stored answer, byte for byte.
	again := f.post(t, "tok-a", "k-own", `{ "amount":7 }`)
	if again.status != 201 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" || f.calls.Load() != 1 {
		t.Fatalf("retry = %+v (calls %d), want the stored answer replayed and no execution", again, f.calls.Load())
	}
	if rec := f.record(t, "tenant-a", "k-own"); rec.Status != idem.StatusCompleted || string(rec.Response.Body) != first.body {
		t.Errorf("record = %s %q, want the handler's own completion", rec.Status, rec.Response.Body)
	}
	// Another command under the key, a refused command, a missing key:
	// the table answers each, the operation's own code included.
	for _, c := range []struct {
		key, body, code string
		status          int
	}{
		{"k-own", `{"amount": 8}`, idem.ECodeKeyReused, http.StatusConflict},
		{"k-bad", `{"amount": -1}`, "AMOUNT_NOT_POSITIVE", http.StatusTeapot},
		{"", `{"amount": 1}`, idem.ECodeKeyMissing, http.StatusBadRequest},
	} {
		a := f.post(t, "tok-a", c.key, c.body)
		var p idemhttp.Problem
		_ = json.Unmarshal([]byte(a.body), &p)
		if a.status != c.status || p.ErrorCode != c.code || p.Status != c.status || a.header.Get("Content-Type") != idemhttp.ProblemContentType ||
			p.Type != idemhttp.DefaultTypeBase+strings.ToLower(c.code) {
			t.Errorf("key %q body %s = %d %s, want %d %s as a problem", c.key, c.body, a.status, a.body, c.status, c.code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"execute/false/", "replay/true/", "conflict/false/" + idem.ECodeKeyReused, "unknown/false/AMOUNT_NOT_POSITIVE", "unknown/false/" + idem.ECodeKeyMissing}
	if fmt.Sprint(observed) != fmt.Sprint(want) {
		t.Errorf("observed %v, want %v", observed, want)
	}
}

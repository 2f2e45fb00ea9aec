package ambiguous_test

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
	"github.com/idemcoord/idem/store"
)

const (
	tenant = "tenant-a"
	opName = "create_transfer"
	// article is a payment command of the payments operation.
	article = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`
)

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
	op.LockFor = 30 * time.Second
	op.Window = time.Hour
	if err := e.Register(op); err != nil {
		t.Fatal(err)
	}
	return e
}

func request(key string, h []string) engine.Request {
	return engine.Request{Operation: opName, Tenant: tenant, Key: key, RequestHashes: h}
}

func record(t *testing.T, st *store.Store, key string) *idem.Record {
	t.Helper()
	rec, err := st.Get(context.Background(), idem.Scope{Tenant: tenant, Operation: opName, Key: key})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

// executedOnce checks the end of a request whose commit was ambiguous: the
// operation ran once, ans is that execution's answer (not a replay), the
// record holds it COMPLETED, and a retry replays it without running the
// operation again.
func executedOnce(ctx context.Context, t *testing.T, e *engine.Engine, direct *store.Store, c *counting, key string, h []string, ans engine.Answer) {
	t.Helper()
	if n := c.n.Load(); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
	if ans.Replayed || ans.Status != idem.StatusCompleted || string(ans.Response.Body) != `{"id":"tr_1","token":1}` {
		t.Errorf("answer = replayed %v status %s body %s, want the first execution's", ans.Replayed, ans.Status, ans.Response.Body)
	}
	rec := record(t, direct, key)
	if rec.Status != idem.StatusCompleted || rec.Response == nil || !bytes.Equal(rec.Response.Body, ans.Response.Body) {
		t.Errorf("record = %s %v, want COMPLETED with the answer given", rec.Status, rec.Response)
	}
	again, err := e.Do(ctx, request(key, h))
	if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, ans.Response.Body) {
		t.Errorf("retry = %+v, %v; want a replay of the first answer", again, err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("executions after the retry = %d, want 1", n)
	}
}

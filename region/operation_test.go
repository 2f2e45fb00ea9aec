package region_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/region"
)

// transfers is an operation of the node's own besides payments: one route
// and an engine operation whose Recover finds the transfer downstream.
func transfers() region.Operation {
	op := engine.Operation{
		Name: "create_transfer",
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			return engine.Result{}, fmt.Errorf("not executed in these tests")
		},
		Recover: func(context.Context, *engine.Attempt) (engine.Result, error) {
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte(`{"found":"downstream"}`)}}, nil
		},
	}
	return region.Operation{
		Name: op.Name,
		Routes: func(*region.Server) []region.Route {
			return []region.Route{{Pattern: "POST /transfers", Handler: func(w http.ResponseWriter, _ *http.Request, tenant string) {
				w.WriteHeader(http.StatusAccepted)
				_, _ = fmt.Fprintf(w, `{"tenant":%q}`, tenant)
			}}}
		},
		Engine: &op,
	}
}

// TestNodeServesItsListOfOperations: a node serves exactly the operations
// it is given, each behind authentication, and keeps their records from the
// coordination API; without payments, POST /payments does not exist.
func TestNodeServesItsListOfOperations(t *testing.T) {
	st, _ := storetest.New(t)
	srv, err := region.NewServer(region.Config{Region: "test", Tokens: map[string]string{"tok-a": "tenant-a"},
		Operations: []string{"op"}}, st, transfers())
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	n := &node{t: t, url: hs.URL, store: st}
	if a := n.do(http.MethodPost, "/transfers", "", nil, "{}"); a.status != 401 || a.code() != idem.ECodeUnauthenticated {
		t.Errorf("unauthenticated POST /transfers = %d %s, want 401", a.status, a.body)
	}
	if a := n.do(http.MethodPost, "/transfers", "tok-a", nil, "{}"); a.status != 202 || string(a.body) != `{"tenant":"tenant-a"}` {
		t.Errorf("POST /transfers = %d %s, want the operation's handler with the token's tenant", a.status, a.body)
	}
	if a := n.do(http.MethodGet, "/transfers", "tok-a", nil, ""); a.status != 405 || a.code() != idem.ECodeMethodNotAllowed {
		t.Errorf("GET /transfers = %d %s, want 405", a.status, a.body)
	}
	if a := n.do(http.MethodPost, "/payments", "tok-a", map[string]string{"Idempotency-Key": "k"}, article); a.status != 404 || a.code() != idem.ECodeNotFound {
		t.Errorf("POST /payments on a node without payments = %d %s, want 404 NOT_FOUND", a.status, a.body)
	}
	if a := n.do(http.MethodPost, "/v1/coordination/create_transfer/k/begin", "tok-a", nil, `{"requestHash":"v2:ab"}`); a.status != 422 {
		t.Errorf("coordination API on the node's own operation = %d %s, want 422", a.status, a.body)
	}
	if _, err := region.NewServer(region.Config{Operations: []string{"create_transfer"}}, st, transfers()); err == nil {
		t.Error("NewServer accepted a coordination operation named like one of the node's own")
	}
	if _, err := region.NewServer(region.Config{}, st, transfers(), transfers()); err == nil {
		t.Error("NewServer accepted one operation twice")
	}
}

// TestRecoveryWorkerRecoversEveryOperation: the recovery worker runs the
// engine's RecoverStale, so a stale record of any registered operation (not
// only payments') is settled by that operation's Recover.
func TestRecoveryWorkerRecoversEveryOperation(t *testing.T) {
	st, _ := storetest.New(t)
	reg := prometheus.NewRegistry()
	srv, err := region.NewServer(region.Config{Region: "test", Registry: reg}, st, transfers())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = srv.Close(context.Background())
	})
	h, err := fingerprint.Hashes("create_transfer", map[string]any{"amount": "1"})
	if err != nil {
		t.Fatal(err)
	}
	scope := idem.Scope{Tenant: "tenant-a", Operation: "create_transfer", Key: "t-1"}
	// An owner that acted (past RECEIVED) and died.
	d, err := st.Begin(ctx, idem.BeginRequest{Scope: scope, RequestHashes: h, HashVersion: fingerprint.Version,
		Owner: "dead", LockFor: time.Minute, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Checkpoint(ctx, d.Lease, engine.CheckpointStarted); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET locked_until = now() - INTERVAL '1 second' WHERE idempotency_key = 't-1'`)
	srv.StartWorkers(ctx, region.WorkerConfig{RecoveryInterval: 10 * time.Millisecond})
	for {
		rec, err := st.Get(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == idem.StatusCompleted {
			if string(rec.Response.Body) != `{"found":"downstream"}` {
				t.Fatalf("recovered answer = %q", rec.Response.Body)
			}
			break
		}
		time.Sleep(10 * time.Millisecond) // poll until the worker has run
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == "idempotency_recovery_total" && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == engine.RecoveryCompleted {
				got = m.GetCounter().GetValue()
			}
		}
	}
	if got != 1 {
		t.Errorf("idempotency_recovery_total{outcome=completed} = %v, want 1", got)
	}
}

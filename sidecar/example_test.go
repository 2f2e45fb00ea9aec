package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/memcoord"
	"github.com/idemcoord/idem/sidecar"
)

// An existing service (here an httptest server that knows nothing of
// idempotency) behind the proxy: the client's retry with the same key is
// answered from the record, and the service is called once, with a
// derived key it can deduplicate on. idemd does the same for the routes of
// its --proxy-routes flag, over PostgreSQL; the engine keeps its records in
// memory here (package memcoord, for tests).
func Example() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("upstream: %s %s %s (tenant %s, derived key %t)\n", r.Method, r.URL.Path, body, r.Header.Get("Idem-Tenant"),
			r.Header.Get("Idempotency-Key") == sidecar.DerivedKey("acme", "create_transfer", "order-42", 0))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transferId":"tr_%d"}`, n)
	}))
	defer upstream.Close()

	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + upstream.URL)
	if err != nil {
		panic(err)
	}
	proxy, err := sidecar.New(engine.New(memcoord.New(), engine.Options{}), sidecar.Options{
		Routes: routes,
		// The tenant comes from the caller's credentials, never from the
		// request's fields; here one token stands for tenant acme.
		Tenant: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") != "Bearer secret-token" {
				return "", fmt.Errorf("unknown token")
			}
			return "acme", nil
		},
	})
	if err != nil {
		panic(err)
	}
	for range 2 {
		req := httptest.NewRequest("POST", "/transfers", strings.NewReader(`{"amount":"10.00","to":"acc_2"}`))
		req.Header.Set("Authorization", "Bearer secret-token")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, req)
		fmt.Printf("client: %d %s replayed=%q\n", rec.Code, rec.Body, rec.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("upstream calls:", calls.Load())
	// Output:
	// upstream: POST /transfers {"amount":"10.00","to":"acc_2"} (tenant acme, derived key true)
	// client: 201 {"transferId":"tr_1"} replayed=""
	// client: 201 {"transferId":"tr_1"} replayed="true"
	// upstream calls: 1
}

package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/memcoord"
)

// A service's own operation, create_transfer, made idempotent: the handler
// knows nothing of keys; the second request with the same key gets the first
// answer, byte for byte, and the transfer is made once. The engine keeps its
// records in memory here (package memcoord, for tests); a service gives it
// a *store.Store on PostgreSQL or CockroachDB.
func Example() {
	eng := engine.New(memcoord.New(), engine.Options{})
	idempotent, err := idemhttp.Middleware(eng, idemhttp.Options{
		Operation: "create_transfer",
		Tenant:    idemhttp.BearerTokens(map[string]string{"secret-token": "acme"}), // or your own auth
	})
	if err != nil {
		panic(err)
	}
	transfers := 0
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/transfers", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		transfers++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transferId":"tr_%d","from":%q}`, transfers, r.PathValue("account"))
	})))

	for range 2 {
		req := httptest.NewRequest("POST", "/accounts/acc_1/transfers", strings.NewReader(`{"amount":"10.00","to":"acc_2"}`))
		req.Header.Set("Authorization", "Bearer secret-token")
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%d %s replayed=%q\n", rec.Code, rec.Body, rec.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("transfers made:", transfers)
	// Output:
	// 201 {"transferId":"tr_1","from":"acc_1"} replayed=""
	// 201 {"transferId":"tr_1","from":"acc_1"} replayed="true"
	// transfers made: 1
}

package region_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
)

// BenchmarkAnswerCache serves, in process over PostgreSQL, in one run: a
// fresh payment (POST /payments with a new key), a replay of a completed
// payment at a node without the answer cache (the store's one-statement
// read) and at a node with it (from memory), each with the first request's
// bytes and with the same command re-serialised (members in another order:
// the raw hash differs, so the command is parsed and fingerprinted, as
// every replay was before the raw hash), and a read of the same payment
// (GET /payments/{id}):
//
//	go test ./region -run '^$' -bench BenchmarkAnswerCache -benchtime 3000x
func BenchmarkAnswerCache(b *testing.B) {
	st, _ := storetest.New(b)
	node := func(cache int64) http.Handler {
		pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour, AnswerCache: engine.AnswerCache{Bytes: cache}})
		srv, err := region.NewServer(region.Config{Tokens: map[string]string{"tok-a": "tenant-a"}}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
		if err != nil {
			b.Fatal(err)
		}
		return srv.Handler()
	}
	cached, plain := node(64<<20), node(0)
	send := func(h http.Handler, key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	post := func(h http.Handler, key string) *httptest.ResponseRecorder {
		return send(h, key, `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"`+key+`"}`)
	}
	first := post(plain, "replayed")
	if first.Code != http.StatusCreated {
		b.Fatalf("first POST: %d %s", first.Code, first.Body)
	}
	const reserialised = `{"merchantReference":"replayed","currency":"EUR","amount":"10.00","accountId":"acc_1"}`
	replay := func(h http.Handler, body string) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if w := send(h, "replayed", body); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" ||
					w.Body.String() != first.Body.String() {
					b.Fatalf("replay: %d %s", w.Code, w.Body)
				}
			}
		}
	}
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if w := post(cached, fmt.Sprint("fresh-", i)); w.Code != http.StatusCreated {
				b.Fatalf("fresh: %d %s", w.Code, w.Body)
			}
		}
	})
	const same = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"replayed"}`
	b.Run("replay/store", replay(plain, same))
	b.Run("replay/store-reserialised", replay(plain, reserialised))
	b.Run("replay/memory", replay(cached, same))
	b.Run("replay/memory-reserialised", replay(cached, reserialised))
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		loc := first.Header().Get("Location")
		for b.Loop() {
			req := httptest.NewRequest(http.MethodGet, loc, nil)
			req.Header.Set("Authorization", "Bearer tok-a")
			w := httptest.NewRecorder()
			cached.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Fatalf("get: %d %s", w.Code, w.Body)
			}
		}
	})
}

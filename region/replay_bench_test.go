package region_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
)

// BenchmarkReplayAgainstGet serves, in process (no network), a replay of a
// completed payment (POST /payments with its key and body) and a read of
// the same payment (GET /payments/{id}) through one node over PostgreSQL:
// the work a replay does that a read does not. Profile each on its own:
//
//	go test ./region -run '^$' -bench 'BenchmarkReplayAgainstGet/replay' -benchtime 5000x -cpuprofile replay.prof
//	go test ./region -run '^$' -bench 'BenchmarkReplayAgainstGet/get' -benchtime 5000x -cpuprofile get.prof
func BenchmarkReplayAgainstGet(b *testing.B) {
	st, _ := storetest.New(b)
	srv, err := region.NewServer(region.Config{Tokens: map[string]string{"tok-a": "tenant-a"}}, st,
		paymentsnode.Operation(payments.NewService(st, payments.Config{Region: "test", Window: time.Hour}), paymentsnode.Outbox{}))
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	const body = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"replayed"}`
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "replayed")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	first := post()
	if first.Code != http.StatusCreated {
		b.Fatalf("first POST: %d %s", first.Code, first.Body)
	}
	loc := first.Header().Get("Location")
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if w := post(); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				b.Fatalf("replay: %d %s", w.Code, w.Body)
			}
		}
	})
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := httptest.NewRequest(http.MethodGet, loc, nil)
			req.Header.Set("Authorization", "Bearer tok-a")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Fatalf("get: %d %s", w.Code, w.Body)
			}
		}
	})
}

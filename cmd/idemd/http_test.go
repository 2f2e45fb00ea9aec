package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
)

// TestOperationsFlag: a real idemd serves the coordination operations it
// declares, refuses others with 404 OPERATION_UNKNOWN, and exposes the
// declared operations' series at 0 from the start.
func TestOperationsFlag(t *testing.T) {
	db := pgtest.NewDatabase(t)
	p := startIdemd(t, db, "--operations", "create_transfer")
	get := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(http.MethodGet, "/metrics", ""); status != 200 ||
		!strings.Contains(body, `idempotency_requests_total{operation="create_transfer",outcome="execute"} 0`) ||
		!strings.Contains(body, `idempotency_requests_total{operation="create_payment",outcome="rejected"} 0`) {
		t.Errorf("fresh /metrics = %d without the declared operations' series at 0", status)
	}
	if status, body := get(http.MethodPost, "/v1/coordination/create_transfer/k1/begin", `{"requestHash":"v1:abc"}`); status != 200 || !strings.Contains(body, `"outcome":"execute"`) {
		t.Errorf("declared operation = %d %s", status, body)
	}
	if status, body := get(http.MethodPost, "/v1/coordination/create_refund/k1/begin", `{"requestHash":"v1:abc"}`); status != 404 || !strings.Contains(body, idem.ECodeOperationUnknown) {
		t.Errorf("undeclared operation = %d %s, want 404 %s", status, body, idem.ECodeOperationUnknown)
	}
}

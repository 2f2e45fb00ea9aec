package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/region"
)

// TestParseHTTPFlags: the server's timeouts, header bound and declared
// operations come from flags or IDEM_* variables, with safe defaults.
func TestParseHTTPFlags(t *testing.T) {
	m := NewMain()
	if err := m.ParseFlags([]string{"--database-url", "x"}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	if m.HTTP.ReadHeaderTimeout != 5*time.Second || m.HTTP.ReadTimeout != 30*time.Second || m.HTTP.IdleTimeout != 120*time.Second ||
		m.HTTP.WriteTimeout != region.DefaultWriteTimeout || m.HTTP.MaxHeaderBytes != region.DefaultMaxHeaderBytes || len(m.Operations) != 0 {
		t.Errorf("defaults = %+v, operations %q", m.HTTP, m.Operations)
	}
	env := map[string]string{"IDEM_DATABASE_URL": "x", "IDEM_OPERATIONS": "create_transfer, ship.order", "IDEM_READ_TIMEOUT": "7s",
		"IDEM_IDLE_TIMEOUT": "9s", "IDEM_MAX_HEADER_BYTES": "4096"}
	m = NewMain()
	if err := m.ParseFlags([]string{"--read-header-timeout", "2s", "--write-timeout", "11s"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if m.HTTP.ReadHeaderTimeout != 2*time.Second || m.HTTP.ReadTimeout != 7*time.Second || m.HTTP.WriteTimeout != 11*time.Second ||
		m.HTTP.IdleTimeout != 9*time.Second || m.HTTP.MaxHeaderBytes != 4096 || strings.Join(m.Operations, ",") != "create_transfer,ship.order" {
		t.Errorf("parsed %+v, operations %q", m.HTTP, m.Operations)
	}
	for _, bad := range [][]string{{"--read-timeout", "0s"}, {"--idle-timeout", "-1s"}, {"--max-header-bytes", "0"}} {
		if err := NewMain().ParseFlags(append(bad, "--database-url", "x"), func(string) string { return "" }); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
}

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

package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/telemetry"
)

// TestAdminTokens: the admin API's tokens come from --admin-tokens-file
// or IDEM_ADMIN_TOKENS, never from the command line; a real idemd answers
// its admin API with them and with nothing else (not a tenant's token),
// and a settle through it is logged with the key's hash and counted.
func TestAdminTokens(t *testing.T) {
	for _, args := range [][]string{{"--admin-tokens", "adm=alice"}, {"-admin-tokens=adm=alice"}} {
		if _, _, err := parseWith(t, args, nil); err == nil || !strings.Contains(err.Error(), "--admin-tokens-file") || strings.Contains(err.Error(), "adm=alice") {
			t.Errorf("%q: %v, want a refusal pointing to --admin-tokens-file that does not echo the token", args, err)
		}
	}
	file := tokensFile(t, "# operators\nadm-alice-0123456789=alice\n")
	if m, _, err := parseWith(t, []string{"--admin-tokens-file", file}, nil); err != nil || m.AdminTokens["adm-alice-0123456789"] != "alice" || len(m.AdminTokens) != 1 {
		t.Errorf("--admin-tokens-file: %v, %v", m.AdminTokens, err)
	}
	if m, _, err := parseWith(t, nil, map[string]string{"IDEM_ADMIN_TOKENS": "adm-b=bob"}); err != nil || m.AdminTokens["adm-b"] != "bob" {
		t.Errorf("IDEM_ADMIN_TOKENS: %v, %v", m.AdminTokens, err)
	}
	if _, _, err := parseWith(t, []string{"--admin-tokens-file", file}, map[string]string{"IDEM_ADMIN_TOKENS": "x=y"}); err == nil {
		t.Error("--admin-tokens-file and IDEM_ADMIN_TOKENS together were accepted")
	}
	if _, _, err := parseWith(t, nil, map[string]string{"IDEM_ADMIN_TOKENS": "secret-alone"}); err == nil || strings.Contains(err.Error(), "secret-alone") {
		t.Errorf("malformed IDEM_ADMIN_TOKENS: %v, want an error without its content", err)
	}

	p := startIdemd(t, pgtest.NewDatabase(t), "--payments=false", "--operations", "op", "--admin-tokens-file", file)
	call := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := call(http.MethodPost, "/v1/coordination/op/admin-key-1/begin", "tok-a", `{"requestHash":"v1:abc"}`); status != 200 {
		t.Fatalf("begin: %d %s", status, body)
	}
	if status, body := call(http.MethodPost, "/v1/coordination/op/admin-key-1/fail", "tok-a", `{"fencingToken":1,"status":"UNKNOWN_REQUIRES_RECOVERY"}`); status != 204 {
		t.Fatalf("fail: %d %s", status, body)
	}
	if status, body := call(http.MethodGet, "/v1/admin/records?status=UNKNOWN_REQUIRES_RECOVERY", "tok-a", ""); status != 401 || !strings.Contains(body, idem.ECodeUnauthenticated) {
		t.Errorf("a tenant's token at the admin API: %d %s", status, body)
	}
	if status, body := call(http.MethodGet, "/v1/admin/records?status=UNKNOWN_REQUIRES_RECOVERY", "adm-alice-0123456789", ""); status != 200 || !strings.Contains(body, `"key":"admin-key-1"`) {
		t.Errorf("the admin token at the admin API: %d %s", status, body)
	}
	status, body := call(http.MethodPost, "/v1/admin/records/tenant-a/op/admin-key-1/settle", "adm-alice-0123456789", `{"as":"FAILED_RETRYABLE","reason":"OPS-3"}`)
	if status != 200 || !strings.Contains(body, `"by":"alice via node `) {
		t.Errorf("settle: %d %s", status, body)
	}
	if _, metrics := call(http.MethodGet, "/metrics", "", ""); !strings.Contains(metrics, `idem_records_settled_total{as="FAILED_RETRYABLE"} 1`) ||
		!strings.Contains(metrics, `idem_records_settled_total{as="COMPLETED"} 0`) {
		t.Errorf("/metrics has no idem_records_settled_total of the settle")
	}
	log := p.log.String()
	if !strings.Contains(log, "record settled by hand") || !strings.Contains(log, telemetry.KeyHash("admin-key-1")) || strings.Contains(log, "admin-key-1") {
		t.Errorf("the node's log of the settle:\n%s", log)
	}
}

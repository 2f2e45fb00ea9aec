package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/telemetry"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminListenerAndLogs: --admin-listen serves pprof and the build
// information on its own port, never on the public one; the public
// /metrics carries the standard series; with --log-format json
// --log-level debug every line of a request names its tenant, operation,
// key hash (never the key), region, node and the caller's trace id.
func TestAdminListenerAndLogs(t *testing.T) {
	db := pgtest.NewDatabase(t)
	admin := freeAddr(t)
	p := startIdemd(t, db, "--admin-listen", admin, "--log-format", "json", "--log-level", "debug",
		"--region", "eu-west", "--node-id", "eu-west-7")

	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/goroutine?debug=1": 200, "/debug/buildinfo": 200, "/debug/vars": 200, "/payments": 404} {
		if got, body := get(t, "http://"+admin+path); got != want {
			t.Errorf("admin %s: %d, want %d: %.200s", path, got, want, body)
		}
	}
	for _, path := range []string{"/debug/pprof/", "/debug/buildinfo", "/debug/vars"} {
		if got, _ := get(t, p.url+path); got != http.StatusNotFound {
			t.Errorf("public %s: %d, want 404", path, got)
		}
	}
	_, metrics := get(t, p.url+"/metrics")
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "idem_build_info", "idem_pgxpool_total_conns"} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("/metrics has no %s", name)
		}
	}

	const (
		key     = "log-join-key-8812"
		traceID = "0af7651916cd43dd8448eb211c80319c"
	)
	req, _ := http.NewRequest(http.MethodPost, p.url+"/payments", strings.NewReader(article))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("payment: %d", resp.StatusCode)
	}
	// The key reused for another command: a warning, which names the key
	// by its hash only.
	req, _ = http.NewRequest(http.MethodPost, p.url+"/payments", strings.NewReader(strings.Replace(article, "10.00", "11.00", 1)))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity && resp.StatusCode != http.StatusConflict {
		t.Fatalf("reused key: %d", resp.StatusCode)
	}
	p.stop()
	if !strings.Contains(p.log.String(), "idempotency key reused") {
		t.Errorf("no warning of the reused key:\n%s", p.log)
	}
	if strings.Contains(p.log.String(), key) {
		t.Errorf("the log holds the idempotency key itself:\n%s", p.log)
	}
	want := map[string]string{"region": "eu-west", "node": "eu-west-7", "tenant": "tenant-a",
		"operation": "create_payment", "key_hash": telemetry.KeyHash(key), "trace_id": traceID}
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("not a JSON log line: %s", sc.Text())
			continue
		}
		if l["route"] != "POST /payments" && l["trace_id"] == nil {
			continue
		}
		seen++
		for k, v := range want {
			if l[k] != v {
				t.Errorf("log line %v: %s = %v, want %s", l, k, l[k], v)
			}
		}
	}
	if seen == 0 {
		t.Errorf("no log line of the request:\n%s", p.log)
	}
}

// TestLogFlagsRefuseUnknownValues: a mistyped level or format stops the
// node at start.
func TestLogFlagsRefuseUnknownValues(t *testing.T) {
	for _, args := range [][]string{{"--log-level", "verbose"}, {"--log-format", "xml"}} {
		if err := NewMain().ParseFlags(append(args, "--database-url", "x"), func(string) string { return "" }); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

const recordsAdminToken = "adm-records-0123456789"

// forgetfulUpstream is a service behind a sidecar route that executes
// every request it gets and counts it, and drops the connection instead of
// answering the first request of each key it is told to: its answer is
// lost after it acted.
type forgetfulUpstream struct {
	url   string
	mu    sync.Mutex
	calls map[string]int // by derived key
	drop  map[string]bool
}

func newForgetfulUpstream(t *testing.T) *forgetfulUpstream {
	t.Helper()
	u := &forgetfulUpstream{calls: map[string]int{}, drop: map[string]bool{}}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		u.mu.Lock()
		u.calls[key]++
		n, drop := u.calls[key], u.drop[key]
		delete(u.drop, key)
		u.mu.Unlock()
		if drop {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":"tr_%d"}`, n)
	}))
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

func (u *forgetfulUpstream) callsOf(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[key]
}

// recordsNode is a node over a store of a throwaway PostgreSQL, with a
// sidecar route without lookup= in front of up, a tenant's token and an
// admin token. It returns the node's URL and the store's.
func recordsNode(t *testing.T, up *forgetfulUpstream) (nodeURL, dbURL string) {
	t.Helper()
	ctx := context.Background()
	dbURL = emptyDatabase(t)
	st, err := store.Open(ctx, dbURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + up.url)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := region.NewServer(region.Config{Region: "eu-west", NodeID: "n1", Tokens: map[string]string{"tok-a": "tenant-a"},
		AdminTokens: map[string]string{recordsAdminToken: "alice"}, Sidecar: region.SidecarConfig{Routes: routes}}, st)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, dbURL
}

// transfer posts a transfer with key to the node as tenant-a.
func transfer(t *testing.T, node, key string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, node+"/transfers", strings.NewReader(`{"amount":"5.00"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
}

// TestRecordsSettleLostAnswer is the operator's path through a lost
// answer: a sidecar route without lookup= in front of an upstream that
// acted and lost its answer leaves the record UNKNOWN_REQUIRES_RECOVERY, and
// every retry answers 202 without calling the upstream; records list
// --status UNKNOWN_REQUIRES_RECOVERY finds it (over the store and over the
// node's admin API alike), show shows it, settle --as FAILED_RETRYABLE
// (downstream says it did not act) makes the next retry call the upstream
// exactly once, and later retries replay that answer. Another lost answer
// settled --as COMPLETED with downstream's answer is replayed without any
// call. Settling either again is refused.
func TestRecordsSettleLostAnswer(t *testing.T) {
	up := newForgetfulUpstream(t)
	node, db := recordsNode(t, up)
	lost := sidecar.DerivedKey("tenant-a", "create_transfer", "lost-1", 0)
	done := sidecar.DerivedKey("tenant-a", "create_transfer", "lost-2", 0)
	up.drop[lost], up.drop[done] = true, true
	// The first request's answer is lost; its retry takes the record over
	// (fencing token 2) and, with nothing to ask downstream, leaves it
	// unknown again.
	for _, key := range []string{"lost-1", "lost-2"} {
		for range 2 {
			if status, _, body := transfer(t, node, key); status != http.StatusAccepted || !strings.Contains(body, idem.ECodeOutcomeUnknown) {
				t.Fatalf("%s: %d %s, want 202 OUTCOME_UNKNOWN", key, status, body)
			}
		}
	}
	if up.callsOf(lost) != 1 || up.callsOf(done) != 1 {
		t.Fatalf("upstream calls %d, %d; want one each", up.callsOf(lost), up.callsOf(done))
	}

	dbEnv := map[string]string{"IDEM_DATABASE_URL": db}
	nodeEnv := map[string]string{"IDEM_ADMIN_TOKEN": recordsAdminToken}
	for what, run := range map[string]func(args ...string) (int, string){
		"--database-url": func(args ...string) (int, string) { return idemctlRun(t, dbEnv, args...) },
		"--node":         func(args ...string) (int, string) { return idemctlRun(t, nodeEnv, append(args, "--node", node)...) },
	} {
		code, out := run("records", "list", "--status", "UNKNOWN_REQUIRES_RECOVERY")
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "lost-1 tenant-a create_transfer UNKNOWN_REQUIRES_RECOVERY ") ||
			!strings.HasPrefix(lines[1], "lost-2 tenant-a create_transfer UNKNOWN_REQUIRES_RECOVERY ") || !strings.Contains(lines[0], " lock=none") {
			t.Fatalf("%s: records list: exit %d\n%s", what, code, out)
		}
		if code, out := run("records", "list", "--tenant", "tenant-a", "--older-than", "1h"); code != 0 || out != "" {
			t.Errorf("%s: records list --older-than 1h: exit %d\n%s", what, code, out)
		}
		code, out = run("records", "show", "--tenant", "tenant-a", "--operation", "create_transfer", "--key", "lost-1")
		if code != 0 || !strings.Contains(out, "status:         UNKNOWN_REQUIRES_RECOVERY (stuck: can be settled)") ||
			!strings.Contains(out, "fencing token:  2") || !strings.Contains(out, "error code:     OUTCOME_UNKNOWN") {
			t.Errorf("%s: records show: exit %d\n%s", what, code, out)
		}
	}

	code, out := idemctlRun(t, dbEnv, "records", "settle", "--tenant", "tenant-a", "--operation", "create_transfer", "--key", "lost-1",
		"--as", "FAILED_RETRYABLE", "--reason", "OPS-1: the upstream's owners find no transfer under the derived key")
	if code != 0 || !strings.Contains(out, "status:         FAILED_RETRYABLE") || !strings.Contains(out, "checkpoint:     RECEIVED") ||
		!strings.Contains(out, "fencing token:  3") || !strings.Contains(out, "record settled by hand") || !strings.Contains(out, "reason:         OPS-1") {
		t.Fatalf("records settle --as FAILED_RETRYABLE: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "key=lost-1") || strings.Contains(out, "lost-1 ") {
		t.Errorf("the settle's log line names the key:\n%s", out)
	}
	status, _, first := transfer(t, node, "lost-1")
	if status != http.StatusCreated || up.callsOf(lost) != 2 {
		t.Fatalf("the retry after the settle: %d %s, upstream calls %d; want 201 and one more call", status, first, up.callsOf(lost))
	}
	if status, replayed, again := transfer(t, node, "lost-1"); status != http.StatusCreated || replayed != "true" || again != first || up.callsOf(lost) != 2 {
		t.Errorf("the next retry: %d %q %s, upstream calls %d; want the replay and no call", status, replayed, again, up.callsOf(lost))
	}

	body := filepath.Join(t.TempDir(), "answer.json")
	if err := os.WriteFile(body, []byte(`{"transfer":"tr_found"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = idemctlRun(t, nodeEnv, "records", "settle", "--node", node, "--tenant", "tenant-a", "--operation", "create_transfer", "--key", "lost-2",
		"--as", "COMPLETED", "--status-code", "201", "--body-file", body, "--header", "Content-Type: application/json", "--reason", "OPS-2: the upstream has tr_found")
	if code != 0 || !strings.Contains(out, "status:         COMPLETED") || !strings.Contains(out, "answer:         status 201, 23 bytes") ||
		!strings.Contains(out, "as COMPLETED by alice via node n1") {
		t.Fatalf("records settle --as COMPLETED --node: exit %d\n%s", code, out)
	}
	if status, replayed, got := transfer(t, node, "lost-2"); status != http.StatusCreated || replayed != "true" || got != `{"transfer":"tr_found"}` || up.callsOf(done) != 1 {
		t.Errorf("the retry after the settle with an answer: %d %q %s, upstream calls %d", status, replayed, got, up.callsOf(done))
	}

	for _, target := range [][]string{{"--database-url", db}, {"--node", node}} {
		code, out := idemctlRun(t, nodeEnv, append([]string{"records", "settle", "--tenant", "tenant-a", "--operation", "create_transfer", "--key", "lost-2",
			"--as", "FAILED_RETRYABLE", "--reason", "again"}, target...)...)
		if code != 1 || !strings.Contains(out, idem.ECodeRecordNotStuck) {
			t.Errorf("settling a settled record %v: exit %d\n%s", target, code, out)
		}
	}
}

// TestRecordsUsage: mistakes on the command line are usage errors (exit
// 2) that touch nothing: no target or two, an admin token missing or on
// the command line, a settle without its reason or with the wrong answer
// flags.
func TestRecordsUsage(t *testing.T) {
	scope := []string{"--tenant", "t", "--operation", "op", "--key", "k"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"records"}},
		{nil, []string{"records", "purge"}},
		{nil, []string{"records", "list"}},
		{nil, []string{"records", "list", "--database-url", "postgres://x", "--node", "http://n"}},
		{map[string]string{"IDEM_DATABASE_URL": "postgres://x"}, []string{"records", "list", "--node", "http://n"}},
		{nil, []string{"records", "list", "--node", "http://n"}},
		{nil, []string{"records", "list", "--node", "n:8080"}},
		{nil, []string{"records", "list", "--node", "http://n", "--admin-token", recordsAdminToken}},
		{nil, []string{"records", "list", "--database-url", "postgres://x", "--limit", "-1"}},
		{nil, []string{"records", "show", "--database-url", "postgres://x", "--tenant", "t"}},
		{nil, append([]string{"records", "settle", "--database-url", "postgres://x", "--as", "FAILED_RETRYABLE"}, scope...)},
		{nil, append([]string{"records", "settle", "--database-url", "postgres://x", "--as", "DONE", "--reason", "r"}, scope...)},
		{nil, append([]string{"records", "settle", "--database-url", "postgres://x", "--as", "COMPLETED", "--reason", "r"}, scope...)},
		{nil, append([]string{"records", "settle", "--database-url", "postgres://x", "--as", "FAILED_RETRYABLE", "--status-code", "200", "--reason", "r"}, scope...)},
		{nil, append([]string{"records", "settle", "--database-url", "postgres://x", "--as", "COMPLETED", "--status-code", "200", "--body-file", "f", "--header", "bad", "--reason", "r"}, scope...)},
	} {
		if code, out := idemctlRun(t, tc.env, tc.args...); code != 2 {
			t.Errorf("%q (env %v): exit %d, want 2\n%s", tc.args, tc.env, code, out)
		}
	}
}

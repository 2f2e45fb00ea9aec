package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/internal/testbin"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/provider/simulator"
	"github.com/idemcoord/idem/store"
)

// idemdBin is the release idemd; idemdFailpointsBin is built with
// -tags failpoints, for the tests of fault injection (IDEM_FAILPOINTS,
// IDEM_CLOCK_SKEW, --break).
var idemdBin, idemdFailpointsBin string

// peerSecretFile is the peer secret of every multi-region test deployment.
var peerSecretFile string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemdBin = filepath.Join(dir, "idemd")
	idemdFailpointsBin = filepath.Join(dir, "idemd-failpoints")
	peerSecretFile = filepath.Join(dir, "peer-secret")
	if err := os.WriteFile(peerSecretFile, []byte("test-peer-secret-0123456789\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := testbin.Build(idemdBin, "github.com/idemcoord/idem/cmd/idemd"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := testbin.BuildTags([]string{testbin.FailpointsTag}, idemdFailpointsBin, "github.com/idemcoord/idem/cmd/idemd"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const article = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`

// proc is a real idemd child process.
type proc struct {
	t      *testing.T
	bin    string       // the idemd binary; "": idemdBin
	client *http.Client // nil: http.DefaultClient
	args   []string
	env    []string
	url    string
	cmd    *exec.Cmd
	log    *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the child's writes and the test's
// reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startIdemd(t *testing.T, dbURL string, extra ...string) *proc {
	t.Helper()
	return startIdemdEnv(t, nil, dbURL, extra...)
}

// startIdemdEnv starts the release idemd with extra environment variables
// and flags.
func startIdemdEnv(t *testing.T, env []string, dbURL string, extra ...string) *proc {
	t.Helper()
	return startBin(t, idemdBin, env, dbURL, extra...)
}

// startFailpointsIdemd starts the idemd built with -tags failpoints, with
// extra environment variables (such as IDEM_FAILPOINTS) and flags.
func startFailpointsIdemd(t *testing.T, env []string, dbURL string, extra ...string) *proc {
	t.Helper()
	return startBin(t, idemdFailpointsBin, env, dbURL, extra...)
}

func startBin(t *testing.T, bin string, env []string, dbURL string, extra ...string) *proc {
	t.Helper()
	addr := freeAddr(t)
	p := &proc{t: t, bin: bin, url: "http://" + addr, env: env,
		args: append([]string{"--listen", addr, "--database-url", dbURL, "--auth-tokens-file", tokensFile(t, "tok-a=tenant-a\n")}, extra...)}
	p.start()
	t.Cleanup(p.stop)
	return p
}

// tokensFile writes content to a new tokens file (mode 0600) and returns
// its path.
func tokensFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *proc) start() {
	p.t.Helper()
	p.log = &syncBuffer{}
	bin := p.bin
	if bin == "" {
		bin = idemdBin
	}
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	client := p.client
	if client == nil {
		client = http.DefaultClient
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := client.Get(p.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	p.t.Fatalf("idemd did not become ready:\n%s", p.log)
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_, _ = p.cmd.Process.Wait()
}

func (p *proc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = p.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.kill()
		<-done
	}
}

func pay(t *testing.T, url, key string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(article))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestTwoProcessesOneDatabase: 50 identical requests split over two idemd
// processes on one database produce one payment and one outbox event.
func TestTwoProcessesOneDatabase(t *testing.T) {
	db := pgtest.NewDatabase(t)
	nodes := []*proc{startIdemd(t, db), startIdemd(t, db)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	bodies := map[string]int{}
	start := make(chan struct{})
	for i := range 50 {
		wg.Go(func() {
			<-start
			status, body, _ := pay(t, nodes[i%2].url, "two-procs")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case status == 201:
				bodies[string(body)]++
			case status == 409 && bytes.Contains(body, []byte(idem.ECodeInProgress)):
			default:
				t.Errorf("answer %d %s", status, body)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(bodies) != 1 {
		t.Errorf("distinct 201 bodies = %d, want 1: %v", len(bodies), bodies)
	}
	st := openStore(t, db)
	for table, want := range map[string]int{"payments": 1, "outbox_events": 1, "idempotency_records": 1} {
		if n := storetest.Count(t, st, "SELECT count(*) FROM "+table); n != want {
			t.Errorf("%s has %d rows, want %d", table, n, want)
		}
	}
}

// TestKilledAfterProviderRequestSent: the node is SIGKILLed while the provider
// is charging; after a restart the recovery worker completes the record with
// no retry from the client, and a later retry replays the one payment.
func TestKilledAfterProviderRequestSent(t *testing.T) {
	db := pgtest.NewDatabase(t)
	sim, err := simulator.NewServer(simulator.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(sim.Handler())
	defer func() { hs.Close(); _ = sim.Close() }()
	client := &provider.Client{BaseURL: hs.URL}
	ctx := context.Background()
	if err := client.SetFault(ctx, provider.Fault{Mode: provider.FaultSlow, Times: 1, Delay: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	node := startIdemd(t, db, "--provider-url", hs.URL, "--lock-timeout", "3s", "--recovery-interval", "200ms")
	go pay(t, node.url, "killed-1") // never answered: the node dies mid-call

	st := openStore(t, db)
	scope := idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "killed-1"}
	waitFor(t, 20*time.Second, "record at PROVIDER_REQUEST_SENT", func() bool {
		rec, err := st.Get(ctx, scope)
		return err == nil && rec.Checkpoint == payments.CheckpointProviderRequestSent
	})
	node.kill()
	if rec, _ := st.Get(ctx, scope); rec.Status != idem.StatusInProgress {
		t.Fatalf("after kill: %s, want IN_PROGRESS", rec.Status)
	}
	node.start() // same flags, same port
	waitFor(t, 30*time.Second, "recovery worker to complete the record", func() bool {
		rec, err := st.Get(ctx, scope)
		return err == nil && rec.Status == idem.StatusCompleted
	})
	rec, _ := st.Get(ctx, scope)
	counts, err := client.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Total != 1 || counts.ByKey[payments.ProviderKey(rec.ResourceID)] != 1 {
		t.Errorf("charges = %+v, want exactly one for %s", counts, rec.ResourceID)
	}
	status, body, h := pay(t, node.url, "killed-1")
	if status != 201 || h.Get("Idempotent-Replayed") != "true" || !bytes.Contains(body, []byte(rec.ResourceID)) {
		t.Errorf("client retry = %d %s %v; want a 201 replay of %s", status, body, h, rec.ResourceID)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestParseFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{"IDEM_DATABASE_URL": "postgres://x", "IDEM_REPLAY_WINDOW": "2h", "IDEM_AUTH_TOKENS": "a=t1,b=t2"}
	m := NewMain()
	if err := m.ParseFlags([]string{"--region", "eu-west"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if m.DatabaseURL != "postgres://x" || m.Window != 2*time.Hour || m.Region != "eu-west" || m.AuthTokens["b"] != "t2" {
		t.Errorf("parsed %+v", m)
	}
	if err := NewMain().ParseFlags([]string{"--replay-window", "1h", "--body-retention", "30m", "--database-url", "x"}, func(string) string { return "" }); err == nil {
		t.Error("a body retention shorter than the window was accepted")
	}
	if err := NewMain().ParseFlags(nil, func(string) string { return "" }); err == nil {
		t.Error("a missing database URL was accepted")
	}
}

// TestProxyRoutesFlag: --proxy-routes is read from IDEM_PROXY_ROUTES too,
// and a malformed route stops the node before it starts.
func TestProxyRoutesFlag(t *testing.T) {
	env := map[string]string{"IDEM_DATABASE_URL": "postgres://x", "IDEM_PROXY_ROUTES": "POST /transfers=create_transfer@http://127.0.0.1:9000;idempotent-upstream"}
	m := NewMain()
	if err := m.ParseFlags(nil, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if len(m.ProxyRoutes) != 1 || m.ProxyRoutes[0].Operation != "create_transfer" || !m.ProxyRoutes[0].IdempotentUpstream {
		t.Errorf("routes %+v", m.ProxyRoutes)
	}
	if err := NewMain().ParseFlags([]string{"--database-url", "x", "--proxy-routes", "POST /transfers=create_transfer"}, func(string) string { return "" }); err == nil {
		t.Error("a route without an upstream was accepted")
	}
}

// TestWithoutPayments: with --payments=false a node serves the
// coordination API on a store that holds the engine's tables only: it
// creates no payments table, answers POST /payments 404, and claims a key.
func TestWithoutPayments(t *testing.T) {
	db := pgtest.NewDatabase(t)
	p := startIdemd(t, db, "--payments=false", "--operations", "create_transfer")
	if status, body, _ := pay(t, p.url, "k1"); status != http.StatusNotFound {
		t.Errorf("POST /payments without payments = %d %s, want 404", status, body)
	}
	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/coordination/create_transfer/k1/begin", strings.NewReader(`{"command":{"amount":"1.00"}}`))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"outcome":"execute"`) {
		t.Errorf("begin = %d %s, want 200 and outcome execute", resp.StatusCode, b)
	}
	st := openStore(t, db)
	var tables []string
	if err := st.Read(context.Background(), func(q store.Querier) error {
		rows, err := q.Query(context.Background(), `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('payments', 'outbox_events') ORDER BY 1`)
		if err != nil {
			return err
		}
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("a node without payments created %v", tables)
	}
}

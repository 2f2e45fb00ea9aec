//go:build !operator

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/coordclient"
	"github.com/idemcoord/idem/internal/procfs"
	"github.com/idemcoord/idem/internal/testbin"
	"github.com/idemcoord/idem/provider"
)

// TestUp builds idemd, idemctl and etcd once and runs "idemctl up" in
// process and as a real child process.
func TestUp(t *testing.T) {
	bin := upBuildBinaries(t)
	idemd := filepath.Join(bin, "idemd")
	etcd := filepath.Join(bin, "etcd")

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"up", "extra"},
			{"up", "--nodes-per-region", "0"},
			{"up", "--regions", " , "},
			{"up", "--replay-window", "-1s"},
			{"up", "--etcd-members", "-1"},
			{"up", "--store-mode", "everywhere"},
			{"up", "--store-ha", "--etcd-members", "0"},
			{"up", "--store-mode", "global", "--store-ha", "--etcd-members", "0"},
			{"up", "--store-mode", "global", "--store-ha", "--database-url", "postgres://x@127.0.0.1/db"},
			{"up", "--provider=maybe"},
			{"up", "--no-such-flag"},
			{"up", "--proxy-routes", "POST /payments"},
			{"up", "--operations", "Orders"},
			{"up", "--operations", "orders,.."},
			{"up", "--operations", "create_payment"},
			{"up", "--pgbouncer", "--store-ha"},
			{"up", "--pgbouncer", "--tls"},
			{"up", "--pgbouncer", "--database-url", "postgres://x@127.0.0.1/db"},
		} {
			var stderr bytes.Buffer
			env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
			if code := Run(context.Background(), args, env); code != 2 {
				t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, stderr.String())
			}
			if args[1] == "--operations" && !strings.Contains(stderr.String(), "--operations: ") {
				t.Errorf("%q: stderr does not say what is wrong with --operations:\n%s", args, stderr.String())
			}
		}
		// IDEM_OPERATIONS stands for --operations, and is checked alike.
		var stderr bytes.Buffer
		env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(k string) string {
			if k == "IDEM_OPERATIONS" {
				return "orders,with space"
			}
			return ""
		}}
		if code := Run(context.Background(), []string{"up"}, env); code != 2 || !strings.Contains(stderr.String(), "--operations") {
			t.Errorf("IDEM_OPERATIONS with a bad name: exit %d, want 2 naming --operations; stderr:\n%s", code, stderr.String())
		}
	})

	t.Run("missing etcd", func(t *testing.T) {
		t.Chdir(t.TempDir()) // no ./bin
		t.Setenv("PATH", t.TempDir())
		var stderr bytes.Buffer
		env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
		if code := Run(context.Background(), []string{"up", "--idemd", idemd}, env); code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		want := "`go build -o bin/ ./cmd/idemd ./cmd/idemctl && go build -o bin/etcd go.etcd.io/etcd/server/v3 && bin/idemctl up`"
		if !strings.Contains(stderr.String(), "etcd binary not found") || !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q lacks the build command %s", stderr.String(), want)
		}
	})

	t.Run("in process", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		// The provider runs as "idemctl provider": this test binary is not
		// idemctl, so idemctl up looks for it on PATH.
		t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		dir := upStateDir(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stdout, stderr upSyncBuffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
			if k == "IDEM_REGIONS" { // flags fall back to IDEM_* variables
				return "eu-west,us-east"
			}
			return ""
		}}
		code := make(chan int, 1)
		go func() {
			code <- Run(ctx, []string{"up", "--state-dir", dir, "--idemd", idemd, "--etcd", etcd, "--nodes-per-region", "2",
				"--otlp-endpoint", upOTLP, "--operations", "orders.create, ship"}, env)
		}()

		info := upWaitForState(t, filepath.Join(dir, cluster.StateFile), code, &stderr)
		upCheckOTLP(t)
		if len(info.Regions) != 2 || info.Regions[1].Name != "us-east" || len(info.Regions[1].Nodes) != 2 {
			t.Errorf("regions %+v, want eu-west and us-east from IDEM_REGIONS, 2 nodes each", info.Regions)
		}
		upCheckDefaults(t, info)
		upCheckPayment(t, info)
		upCheckSummary(t, stdout.String(), info)
		upCheckCoordination(t, info, stdout.String())

		cancel() // what SIGINT does through signal.NotifyContext
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", c, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("idemctl up did not return after its context ended")
		}
		if kids := procfs.Children(os.Getpid()); len(kids) != 0 {
			t.Errorf("child processes left: %v", kids)
		}
		if _, err := os.Stat(filepath.Join(dir, cluster.StateFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cluster.json after exit: %v, want it removed", err)
		}
	})

	t.Run("tls", func(t *testing.T) {
		t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		dir := upStateDir(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stdout, stderr upSyncBuffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
		code := make(chan int, 1)
		go func() {
			code <- Run(ctx, []string{"up", "--tls", "--state-dir", dir, "--idemd", idemd, "--etcd", etcd, "--regions", "eu-west,us-east"}, env)
		}()
		info := upWaitForState(t, filepath.Join(dir, cluster.StateFile), code, &stderr)
		upCheckTLS(t, info)
		upCheckDefaults(t, info)
		upCheckPayment(t, info) // through us-east: forwarded over mutual TLS
		upCheckSummary(t, stdout.String(), info)
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", c, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("idemctl up did not return after its context ended")
		}
	})

	t.Run("pgbouncer", func(t *testing.T) {
		if !upHavePgBouncer() {
			t.Skip(`pgbouncer is not installed (Debian package "pgbouncer")`)
		}
		t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		dir := upStateDir(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stdout, stderr upSyncBuffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
		code := make(chan int, 1)
		go func() {
			code <- Run(ctx, []string{"up", "--pgbouncer", "--state-dir", dir, "--idemd", idemd, "--etcd", etcd, "--regions", "eu-west,us-east"}, env)
		}()
		info := upWaitForState(t, filepath.Join(dir, cluster.StateFile), code, &stderr)
		pid := upCheckPgBouncer(t, info, dir)
		upCheckDefaults(t, info)
		upCheckPayment(t, info) // the replay through us-east is forwarded to eu-west
		upCheckSummary(t, stdout.String(), info)
		if want := "through PgBouncer at " + info.PgBouncer.Addr + " (transaction pooling"; !strings.Contains(stdout.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout.String())
		}
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", c, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("idemctl up did not return after its context ended")
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("PgBouncer (pid %d) outlived idemctl up: kill(0) = %v", pid, err)
		}
	})

	t.Run("child process", func(t *testing.T) {
		dir := upStateDir(t)
		// The defaults: three regions of one node, three etcd members, the
		// provider. No --idemd or --etcd: idemctl finds them next to it.
		cmd := exec.Command(filepath.Join(bin, "idemctl"), "up", "--state-dir", dir)
		cmd.Env = upEnvWithoutIdem()
		var stdout, stderr upSyncBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		began := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan int, 1)
		go func() {
			_ = cmd.Wait()
			exited <- cmd.ProcessState.ExitCode()
		}()
		defer func() {
			_ = cmd.Process.Kill()
		}()

		info := upWaitForState(t, filepath.Join(dir, cluster.StateFile), exited, &stderr)
		t.Logf("idemctl up (3 regions, 3 etcd members, provider): cluster.json after %v", time.Since(began).Round(time.Millisecond))
		if len(info.Regions) != 3 || info.Regions[2].Name != "ap-south" {
			t.Errorf("regions %+v, want eu-west, us-east and ap-south", info.Regions)
		}
		upCheckDefaults(t, info)
		upCheckPayment(t, info)
		upCheckSummary(t, stdout.String(), info)
		kids := procfs.Children(cmd.Process.Pid)
		upCheckNoSecretsOnCommandLines(t, kids, info, dir)
		upCheckProviderAdminKey(t, info)
		if len(kids) != 8 { // PostgreSQL, the provider, 3 etcd members and 3 nodes
			var cmds []string
			for _, pid := range kids {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
				cmds = append(cmds, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
			t.Errorf("idemctl up has children %v, want PostgreSQL, the provider, 3 etcd members and 3 nodes:\n%s\nstderr:\n%s",
				kids, strings.Join(cmds, "\n"), stderr.String())
		}

		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("exit %d after SIGINT, want 0; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Fatalf("idemctl up still running a minute after SIGINT; stderr:\n%s", stderr.String())
		}
		for _, pid := range kids {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("pid %d outlived idemctl up: kill(0) = %v", pid, err)
			}
		}
	})
}

// upCheckNoSecretsOnCommandLines checks that no bearer token or provider key
// appears on the command line of a child process, which every local user can
// read in /proc/<pid>/cmdline: they are handed over in files.
func upCheckNoSecretsOnCommandLines(t *testing.T, kids []int, info cluster.Info, stateDir string) {
	t.Helper()
	apiKey, err := os.ReadFile(filepath.Join(stateDir, "secrets", "provider-api-key"))
	if err != nil {
		t.Fatalf("the provider's API key file: %v", err)
	}
	secrets := map[string]string{"provider API key": strings.TrimSpace(string(apiKey)), "provider admin key": info.ProviderAdminKey}
	for tenant, token := range info.Tokens {
		secrets["token of "+tenant] = token
	}
	for what, secret := range secrets {
		if len(secret) < 16 {
			t.Fatalf("%s %q: too short to be a generated secret", what, secret)
		}
	}
	checked := 0
	for _, pid := range kids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			t.Errorf("pid %d: %v", pid, err)
			continue
		}
		checked++
		cmdline := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		for what, secret := range secrets {
			if strings.Contains(cmdline, secret) {
				t.Errorf("the %s is on the command line of pid %d: %s", what, pid, cmdline)
			}
		}
		if strings.Contains(cmdline, "--auth-tokens ") || strings.Contains(cmdline, "--auth-tokens=") {
			t.Errorf("pid %d is given tokens on its command line: %s", pid, cmdline)
		}
	}
	if checked != len(kids) || checked == 0 {
		t.Errorf("checked %d command lines of %d children", checked, len(kids))
	}
}

// upHavePgBouncer reports whether Debian's pgbouncer is installed.
func upHavePgBouncer() bool {
	if _, err := exec.LookPath("pgbouncer"); err == nil {
		return true
	}
	_, err := exec.LookPath("/usr/sbin/pgbouncer")
	return err == nil
}

// upCheckPgBouncer checks a cluster started with --pgbouncer: cluster.json
// names PgBouncer, every database URL (the regions' and the effects
// database) goes through it in the query mode a transaction pooler needs,
// every idemd was given such a URL, and PgBouncer's log is with the
// cluster's. It returns PgBouncer's pid.
func upCheckPgBouncer(t *testing.T, info cluster.Info, stateDir string) int {
	t.Helper()
	b := info.PgBouncer
	if b == nil {
		t.Fatal("cluster.json has no pgbouncer")
	}
	if b.PoolMode != "transaction" || b.Pid <= 0 || !procfs.Alive(b.Pid) || !strings.HasPrefix(b.Addr, "127.0.0.1:") {
		t.Errorf("pgbouncer %+v: want transaction pooling, a running pid and an address on 127.0.0.1", b)
	}
	if strings.Contains(b.ServerURL, b.Addr) {
		t.Errorf("serverUrl %s is PgBouncer's address, want PostgreSQL's", b.ServerURL)
	}
	throughBouncer := func(what, raw string) {
		u, err := url.Parse(raw)
		if err != nil || u.Host != b.Addr || u.Query().Get("default_query_exec_mode") != "exec" {
			t.Errorf("%s %q: want it through PgBouncer (%s) with default_query_exec_mode=exec", what, raw, b.Addr)
		}
	}
	for _, r := range info.Regions {
		throughBouncer(r.Name+"'s databaseUrl", r.DatabaseURL)
	}
	throughBouncer("effectsDatabaseUrl", info.EffectsDatabaseURL)
	nodes := 0
	for _, pid := range procfs.Children(os.Getpid()) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || filepath.Base(strings.Split(string(cmdline), "\x00")[0]) != "idemd" {
			continue
		}
		nodes++
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range strings.Split(string(environ), "\x00") {
			if k, v, _ := strings.Cut(kv, "="); k == "IDEM_DATABASE_URL" || k == "IDEM_EFFECTS_DATABASE_URL" {
				throughBouncer(fmt.Sprintf("idemd (pid %d) %s", pid, k), v)
			}
		}
	}
	if nodes != len(info.Regions) {
		t.Errorf("found %d idemd children, want %d", nodes, len(info.Regions))
	}
	if b.Log != filepath.Join(stateDir, "logs", cluster.PgBouncerLog) {
		t.Errorf("pgbouncer log %s, want it in the cluster's logs directory", b.Log)
	}
	if log, err := os.ReadFile(b.Log); err != nil || len(log) == 0 {
		t.Errorf("PgBouncer's log: %v, %d bytes", err, len(log))
	}
	return b.Pid
}

// upCheckProviderAdminKey checks that the provider's /admin endpoints answer
// with cluster.json's providerAdminKey and refuse a client without it.
func upCheckProviderAdminKey(t *testing.T, info cluster.Info) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := &provider.Client{BaseURL: info.ProviderURL, AdminKey: info.ProviderAdminKey}
	if _, err := admin.Charges(ctx); err != nil {
		t.Errorf("GET /admin/charges with providerAdminKey: %v", err)
	}
	anon := &provider.Client{BaseURL: info.ProviderURL}
	if _, err := anon.Charges(ctx); !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("GET /admin/charges without a key: %v, want ErrUnauthorized", err)
	}
}

// upBuildBinaries builds idemd, idemctl and etcd into a temporary directory.
func upBuildBinaries(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if _, err := testbin.BuildAll(dir); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// upStateDir returns a directory that the postgres OS user can reach when the
// tests run as root (t.TempDir's parent has mode 0700); removed after the
// test.
func upStateDir(tb testing.TB) string {
	tb.Helper()
	base, err := os.MkdirTemp("", "idemctl-up-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(base, "state")
}

// upWaitForState waits for cluster.json and returns its content; it fails if
// exited delivers first (idemctl up ended) or after two minutes.
func upWaitForState(tb testing.TB, path string, exited <-chan int, stderr fmt.Stringer) cluster.Info {
	tb.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		if b, err := os.ReadFile(path); err == nil {
			var info cluster.Info
			if err := json.Unmarshal(b, &info); err != nil {
				tb.Fatalf("%s: %v\n%s", path, err, b)
			}
			return info
		}
		select {
		case code := <-exited:
			tb.Fatalf("idemctl up exited (%d) before writing %s; stderr:\n%s", code, path, stderr)
		case <-deadline:
			tb.Fatalf("no %s after two minutes; stderr:\n%s", path, stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// upCheckTLS checks a cluster started with --tls: every URL is https, the
// CA file is named, keys are private, etcd refuses a client without a
// certificate and the nodes refuse plain HTTP.
func upCheckTLS(tb testing.TB, info cluster.Info) {
	tb.Helper()
	if info.CAFile == "" {
		tb.Fatal("cluster.json has no caFile")
	}
	urls := append([]string{info.ProviderURL}, info.EtcdEndpoints...)
	for _, r := range info.Regions {
		urls = append(urls, r.Nodes...)
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "https://") {
			tb.Errorf("%s is not https", u)
		}
	}
	keys, _ := filepath.Glob(filepath.Join(filepath.Dir(info.CAFile), "*-key.pem"))
	if len(keys) == 0 {
		tb.Error("no key files beside the CA")
	}
	for _, k := range keys {
		if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
			tb.Errorf("%s: %v, mode %v; want 0600", k, err, fi.Mode().Perm())
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: upClientTLS(tb, info)}, Timeout: 10 * time.Second}
	if resp, err := client.Get(info.EtcdEndpoints[0] + "/health"); err == nil {
		resp.Body.Close()
		tb.Errorf("etcd answered a client without a certificate: %s", resp.Status)
	}
	plain := "http://" + strings.TrimPrefix(info.Regions[0].URL, "https://") + "/healthz"
	if resp, err := client.Get(plain); err == nil {
		if resp.StatusCode == http.StatusOK {
			tb.Errorf("a node answered plain HTTP: %s", resp.Status)
		}
		resp.Body.Close()
	}
}

// upCheckDefaults checks what the defaults give: etcd, the provider,
// region-local databases and the tenants placed round-robin.
func upCheckDefaults(tb testing.TB, info cluster.Info) {
	tb.Helper()
	if len(info.EtcdEndpoints) != 3 || info.ProviderURL == "" || info.StoreMode != cluster.StoreRegionLocal {
		tb.Errorf("etcd %q, provider %q, store mode %q; want 3 members, the provider and region-local",
			info.EtcdEndpoints, info.ProviderURL, info.StoreMode)
	}
	if info.Placements["tenant-a"] != info.Regions[0].Name || info.Placements["tenant-b"] != info.Regions[1].Name {
		tb.Errorf("placements %q, want tenant-a in %s and tenant-b in %s", info.Placements, info.Regions[0].Name, info.Regions[1].Name)
	}
	if info.Regions[0].DatabaseURL == info.Regions[1].DatabaseURL {
		tb.Errorf("regions share the database %s in region-local mode", info.Regions[0].DatabaseURL)
	}
}

// upCheckPayment creates a payment on the first region, replays it there,
// then replays it through the last region (forwarded to tenant-a's home
// with etcd; a region of its own, hence a fresh payment, without).
func upCheckPayment(tb testing.TB, info cluster.Info) {
	tb.Helper()
	if len(info.Regions) == 0 || info.Tokens["tenant-a"] == "" || info.DatabaseURL == "" {
		tb.Fatalf("cluster.json lacks regions, a tenant-a token or the database: %+v", info)
	}
	last := info.Regions[len(info.Regions)-1].URL
	for i, try := range []struct{ url, replayed string }{
		{info.Regions[0].URL, ""},
		{info.Regions[0].URL, "true"},
		{last, "true"},
	} {
		want := try.replayed
		if i == 2 && len(info.Placements) == 0 && len(info.Regions) > 1 {
			want = ""
		}
		req, err := http.NewRequest(http.MethodPost, try.url+"/payments", strings.NewReader(upSamplePayment))
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+info.Tokens["tenant-a"])
		req.Header.Set("Idempotency-Key", "abc-123")
		req.Header.Set("Content-Type", "application/json")
		tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: upClientTLS(tb, info)}
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		tr.CloseIdleConnections()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != want {
			tb.Errorf("POST %d to %s: %s, Idempotent-Replayed %q (want 201, %q): %s", i+1, try.url, resp.Status, resp.Header.Get("Idempotent-Replayed"), want, body)
		}
	}
}

// upCheckCoordination checks a cluster started with --operations
// "orders.create, ship": cluster.json lists the operations, the summary
// shows a begin to try, and the coordination API serves them on every
// region: a key that needs escaping in a path, begun through the last
// region (forwarded to tenant-a's home) and completed and read back through
// the first, is the same record.
func upCheckCoordination(tb testing.TB, info cluster.Info, summary string) {
	tb.Helper()
	if len(info.Operations) != 2 || info.Operations[0] != "orders.create" || info.Operations[1] != "ship" {
		tb.Errorf("cluster.json operations %q, want [orders.create ship]", info.Operations)
	}
	if want := info.Regions[0].URL + "/v1/coordination/orders.create/abc-123/begin"; !strings.Contains(summary, want) {
		tb.Errorf("summary lacks %q:\n%s", want, summary)
	}
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: upClientTLS(tb, info)}
	defer tr.CloseIdleConnections()
	client := func(url string) *coordclient.Client {
		return &coordclient.Client{BaseURL: url, Token: info.Tokens["tenant-a"], HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	}
	first, last := client(info.Regions[0].URL), client(info.Regions[len(info.Regions)-1].URL)
	ctx := context.Background()
	scope := idem.Scope{Operation: "orders.create", Key: "order/1?#%2F.."}
	d, err := last.Begin(ctx, idem.BeginRequest{Scope: scope, RequestHashes: []string{"v1:up-check"}, LockFor: time.Minute, Window: time.Hour})
	if err != nil || d.Outcome != idem.OutcomeExecute || d.Record.Key != scope.Key {
		tb.Fatalf("begin through %s = %+v, %v; want execute", info.Regions[len(info.Regions)-1].Name, d, err)
	}
	if err := first.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(`{"id":"o1"}`)}}); err != nil {
		tb.Fatalf("complete through %s: %v", info.Regions[0].Name, err)
	}
	rec, err := first.Get(ctx, scope)
	if err != nil || rec.Key != scope.Key || rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 {
		tb.Errorf("get through %s = %+v, %v; want the completed record", info.Regions[0].Name, rec, err)
	}
}

// upCheckSummary checks that idemctl up printed the endpoints, tokens and a
// curl command.
func upCheckSummary(tb testing.TB, out string, info cluster.Info) {
	tb.Helper()
	cacert := ""
	if info.CAFile != "" {
		cacert = "--cacert " + info.CAFile + " "
	}
	want := []string{info.DatabaseURL, "Press Ctrl-C",
		"curl -s " + cacert + "-X POST " + info.Regions[0].URL + "/payments -H 'Authorization: Bearer " + info.Tokens["tenant-a"] + "'" +
			" -H 'Idempotency-Key: abc-123' -H 'Content-Type: application/json' -d '" + upSamplePayment + "'"}
	for _, r := range info.Regions {
		want = append(want, r.Nodes...)
		for _, n := range r.Nodes {
			want = append(want, n+"/metrics")
		}
	}
	for tenant, token := range info.Tokens {
		want = append(want, tenant+"  "+token+"  home "+info.Placements[tenant])
	}
	want = append(want, info.EtcdEndpoints...)
	want = append(want, "Provider simulator:\n  "+info.ProviderURL+"\n", "region-local store")
	for _, w := range want {
		if !strings.Contains(out, w) {
			tb.Errorf("summary lacks %q:\n%s", w, out)
		}
	}
}

// upClientTLS returns a client configuration trusting info.CAFile, or nil
// without one.
func upClientTLS(tb testing.TB, info cluster.Info) *tls.Config {
	tb.Helper()
	if info.CAFile == "" {
		return nil
	}
	b, err := os.ReadFile(info.CAFile)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		tb.Fatalf("%s holds no certificate", info.CAFile)
	}
	return &tls.Config{RootCAs: pool}
}

// upEnvWithoutIdem is this process's environment without IDEM_* variables,
// which would configure idemctl up.
func upEnvWithoutIdem() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			env = append(env, kv)
		}
	}
	return env
}

// upSyncBuffer is a bytes.Buffer safe for concurrent use.
type upSyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *upSyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *upSyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// upOTLP is a collector address no one listens on: the exporter connects
// lazily, so the nodes serve regardless and only the spans are lost.
const upOTLP = "http://127.0.0.1:9"

// upCheckOTLP checks that every idemd child was started with
// --otlp-endpoint upOTLP.
func upCheckOTLP(tb testing.TB) {
	tb.Helper()
	nodes := 0
	for _, pid := range procfs.Children(os.Getpid()) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) != "idemd" {
			continue
		}
		nodes++
		if !strings.Contains(string(b), "--otlp-endpoint\x00"+upOTLP+"\x00") {
			tb.Errorf("idemd started without --otlp-endpoint %s: %q", upOTLP, args)
		}
	}
	if nodes == 0 {
		tb.Error("no idemd child process found")
	}
}

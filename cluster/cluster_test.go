package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/procfs"
	"github.com/idemcoord/idem/internal/testbin"
)

// Environment of the helper process of TestParentKilledLeavesNothing.
const (
	envHelper   = "CLUSTER_TEST_HELPER"    // "1" runs helperMain instead of the tests
	envIdemd    = "CLUSTER_TEST_IDEMD"     // the idemd binary
	envIdemctl  = "CLUSTER_TEST_IDEMCTL"   // the idemctl binary
	envEtcd     = "CLUSTER_TEST_ETCD"      // the etcd binary
	envStateDir = "CLUSTER_TEST_STATE_DIR" // the helper's Config.StateDir
)

// paymentBody is the sample create-payment body for a merchant reference
// (unique per tenant and account: reusing one with another key is a 409).
func paymentBody(ref string) string {
	return `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"` + ref + `"}`
}

// The binaries built by TestMain; set once before the tests run and only
// read by them.
var (
	idemdPath   string
	idemctlPath string
	etcdPath    string
)

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "1" {
		os.Exit(helperMain())
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cluster-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins, err := testbin.BuildAll(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	idemdPath, idemctlPath, etcdPath = bins.Idemd, bins.Idemctl, bins.Etcd
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// helperMain starts a cluster, prints the pids of its processes as JSON on
// stdout and waits to be killed.
func helperMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{
		IdemdPath:      os.Getenv(envIdemd),
		EtcdPath:       os.Getenv(envEtcd),
		IdemctlPath:    os.Getenv(envIdemctl),
		StateDir:       os.Getenv(envStateDir),
		NodesPerRegion: 2,
		EtcdMembers:    3,
		Provider:       true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	pids := []int{c.PostgresPid(), c.Provider().Pid()}
	for _, p := range append(c.Nodes(), c.EtcdMembers()...) {
		pids = append(pids, p.Pid())
	}
	b, _ := json.Marshal(pids)
	fmt.Println(string(b))
	select {} // until killed
}

func TestStartPaymentAndStop(t *testing.T) {
	dir := stateDir(t)
	c := startCluster(t, cluster.Config{
		StateDir: dir,
		Regions:  []string{"eu-west", "us-east"},
	})
	info := c.Info()

	if len(info.Regions) != 2 || info.Regions[0].Name != "eu-west" || info.Regions[1].Name != "us-east" {
		t.Fatalf("regions = %+v, want eu-west and us-east", info.Regions)
	}
	for _, r := range info.Regions {
		if len(r.Nodes) != 1 || r.URL != r.Nodes[0] || !strings.HasPrefix(r.URL, "http://127.0.0.1:") {
			t.Errorf("region %s: url %q, nodes %q", r.Name, r.URL, r.Nodes)
		}
		if want := "/" + cluster.DatabaseName(r.Name) + "?"; !strings.Contains(r.DatabaseURL, want) {
			t.Errorf("region %s: database %q, want path %s", r.Name, r.DatabaseURL, want)
		}
		if _, err := os.Stat(filepath.Join(dir, "logs", r.Name+"-0.log")); err != nil {
			t.Errorf("node log: %v", err)
		}
	}
	if info.DatabaseURL != info.Regions[0].DatabaseURL || !strings.Contains(info.DatabaseURL, "/idem_eu_west?") {
		t.Errorf("databaseUrl = %q, want the eu-west database", info.DatabaseURL)
	}
	// No etcd, no provider: the single-region behaviour in every region.
	if info.StoreMode != cluster.StoreRegionLocal || len(info.EtcdEndpoints) != 0 || info.ProviderURL != "" || len(info.Placements) != 0 {
		t.Errorf("store mode %q, etcd %q, provider %q, placements %q; want region-local and none",
			info.StoreMode, info.EtcdEndpoints, info.ProviderURL, info.Placements)
	}
	if c.Provider() != nil || len(c.EtcdMembers()) != 0 || c.EtcdClient() != nil || c.Links() != nil {
		t.Error("a cluster without etcd, provider or proxies exposes some")
	}
	if err := c.Partition("local-0->store"); !errors.Is(err, cluster.ErrNotProxied) {
		t.Errorf("Partition without proxies: %v, want ErrNotProxied", err)
	}
	tokenRE := regexp.MustCompile(`^dev_[0-9a-f]{32}$`)
	if len(info.Tokens) != 2 || !tokenRE.MatchString(info.Tokens["tenant-a"]) || !tokenRE.MatchString(info.Tokens["tenant-b"]) ||
		info.Tokens["tenant-a"] == info.Tokens["tenant-b"] {
		t.Errorf("tokens = %q, want distinct dev_<hex> tokens for tenant-a and tenant-b", info.Tokens)
	}

	// cluster.json holds Info.
	statePath := filepath.Join(dir, cluster.StateFile)
	if c.StatePath() != statePath {
		t.Errorf("StatePath = %q, want %q", c.StatePath(), statePath)
	}
	raw, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var onDisk cluster.Info
	if err := json.Unmarshal(raw, &onDisk); err != nil {
		t.Fatalf("cluster.json: %v\n%s", err, raw)
	}
	if !reflect.DeepEqual(onDisk, info) {
		t.Errorf("cluster.json = %+v, want Info %+v", onDisk, info)
	}
	var generic map[string]any
	_ = json.Unmarshal(raw, &generic)
	for _, k := range []string{"regions", "databaseUrl", "tokens", "etcdEndpoints", "providerUrl", "storeMode"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("cluster.json lacks %q:\n%s", k, raw)
		}
	}

	// Every node serves payments for both tenants; a wrong token is refused.
	for _, r := range info.Regions {
		for tenant, token := range info.Tokens {
			resp := postPayment(t, r.URL, token, "key-"+tenant, "invoice-7781")
			if resp.status != http.StatusCreated {
				t.Errorf("POST %s/payments as %s: %d %s", r.URL, tenant, resp.status, resp.body)
			}
		}
		if resp := postPayment(t, r.URL, "dev_wrong", "key-x", "invoice-x"); resp.status != http.StatusUnauthorized {
			t.Errorf("POST with a wrong token: %d, want 401", resp.status)
		}
	}
	// Regions are independent stores: the same key in another region is
	// a new payment, not a replay.
	first := postPayment(t, info.Regions[0].URL, info.Tokens["tenant-a"], "abc-123", "invoice-regions")
	other := postPayment(t, info.Regions[1].URL, info.Tokens["tenant-a"], "abc-123", "invoice-regions")
	if first.status != http.StatusCreated || other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("same key in two regions: %d then %d (replayed %q), want two fresh 201s",
			first.status, other.status, other.header.Get("Idempotent-Replayed"))
	}

	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
	if _, err := os.Stat(statePath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster.json after Stop: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "eu-west-0.log")); err != nil {
		t.Errorf("logs in a given state dir must be kept: %v", err)
	}
	// Stop is idempotent.
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestKillAndRestart(t *testing.T) {
	c := startCluster(t, cluster.Config{NodesPerRegion: 2})
	info := c.Info()
	token := info.Tokens["tenant-a"]
	n0, n1 := c.Node("local", 0), c.Node("local", 1)
	if n0 == nil || n1 == nil || c.Node("local", 2) != nil || c.Node("nowhere", 0) != nil {
		t.Fatalf("Node: got %v, %v; want two nodes in region local", n0, n1)
	}
	if n0.URL() != info.Regions[0].Nodes[0] || n1.URL() != info.Regions[0].Nodes[1] {
		t.Errorf("node URLs %s, %s; Info %q", n0.URL(), n1.URL(), info.Regions[0].Nodes)
	}

	created := postPayment(t, n0.URL(), token, "abc-123", "invoice-7781")
	if created.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", created.status, created.body)
	}

	oldPid, oldURL := n0.Pid(), n0.URL()
	if err := n0.Kill(); err != nil {
		t.Fatal(err)
	}
	if n0.Running() {
		t.Error("Running after Kill")
	}
	select {
	case <-n0.Exited():
	default:
		t.Error("Exited not closed after Kill")
	}
	if err := n0.Wait(context.Background()); err == nil {
		t.Error("Wait after Kill: nil, want the kill's exit error")
	}
	assertGone(t, []int{oldPid})
	if err := n0.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal to a killed node: %v, want os.ErrProcessDone", err)
	}

	// The other node of the region shares its database: a replay.
	if r := postPayment(t, n1.URL(), token, "abc-123", "invoice-7781"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay on the other node: %d, Idempotent-Replayed %q", r.status, r.header.Get("Idempotent-Replayed"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	if err := n0.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v", time.Since(began).Round(time.Millisecond))
	if n0.URL() != oldURL || n0.Pid() == oldPid || !n0.Running() {
		t.Errorf("after Restart: url %s (was %s), pid %d (was %d), running %v", n0.URL(), oldURL, n0.Pid(), oldPid, n0.Running())
	}
	r := postPayment(t, n0.URL(), token, "abc-123", "invoice-7781")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay after restart: %d, Idempotent-Replayed %q: %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if !bytes.Equal(r.body, created.body) {
		t.Errorf("replayed body %s, want the original %s", r.body, created.body)
	}

	// Restart of a running node stops it first.
	if err := n1.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Pause and resume: Stop must still work on a paused node.
	if err := n1.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	stateDir := c.StateDir()
	pids := clusterPids(t, c)
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
	if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary state dir after Stop: %v, want it removed", err)
	}
	if err := n0.Restart(ctx); err == nil || n0.Running() {
		t.Errorf("Restart after Stop: %v, running %v; want an error", err, n0.Running())
	}
	assertNoChildren(t)
}

func TestStartFailureLeavesNothing(t *testing.T) {
	dir := stateDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{
		IdemdPath:     idemdPath,
		StateDir:      dir,
		ExtraNodeArgs: []string{"--no-such-flag"},
		Logger:        testLogger(t),
	})
	if err == nil {
		_ = c.Stop(context.Background())
		t.Fatal("Start succeeded with a bad node flag")
	}
	t.Log(err)
	for _, want := range []string{"local-0", "exited before it was ready", "no-such-flag", filepath.Join(dir, "logs", "local-0.log")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	assertNoChildren(t)
	if _, err := os.Stat(filepath.Join(dir, cluster.StateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster.json after a failed Start: %v", err)
	}
}

// TestExternalDatabase uses a server the cluster did not start: the region
// databases are created on it, and a role that may not create databases
// gets its own database used as it is, for a single region only.
func TestExternalDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(context.Background()); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	}()

	t.Run("create databases", func(t *testing.T) {
		c := startCluster(t, cluster.Config{DatabaseURL: srv.URL(), Regions: []string{"eu-west", "us-east"}})
		info := c.Info()
		if c.PostgresPid() != 0 {
			t.Errorf("PostgresPid = %d, want 0 with an external server", c.PostgresPid())
		}
		if want := srv.URLFor("idem_us_east"); info.Regions[1].DatabaseURL != want {
			t.Errorf("us-east database %q, want %q", info.Regions[1].DatabaseURL, want)
		}
		if r := postPayment(t, info.Regions[1].URL, info.Tokens["tenant-b"], "k1", "invoice-1"); r.status != http.StatusCreated {
			t.Errorf("POST: %d %s", r.status, r.body)
		}
		stopCluster(t, c)
	})

	t.Run("password never on a command line", func(t *testing.T) {
		// The server trusts local connections, so any password works.
		const password = "pw-0123456789abcdef"
		u, err := url.Parse(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("postgres", password)
		c := startCluster(t, cluster.Config{DatabaseURL: u.String(), Regions: []string{"pw"}})
		info := c.Info()
		if r := postPayment(t, info.Regions[0].URL, info.Tokens["tenant-a"], "k1", "invoice-pw"); r.status != http.StatusCreated {
			t.Errorf("POST: %d %s", r.status, r.body)
		}
		for _, p := range c.Nodes() {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid()))
			if err != nil {
				t.Fatal(err)
			}
			if cmdline := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})); strings.Contains(cmdline, password) {
				t.Errorf("the database password is on %s's command line: %s", p.Name(), cmdline)
			}
		}
		stopCluster(t, c)
	})

	t.Run("reuse databases", func(t *testing.T) {
		c := startCluster(t, cluster.Config{DatabaseURL: srv.URL(), Regions: []string{"us-east"}})
		info := c.Info()
		// The payment of the previous subtest is still there: a replay.
		r := postPayment(t, info.Regions[0].URL, info.Tokens["tenant-b"], "k1", "invoice-1")
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("POST: %d (replayed %q) %s, want a replay", r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
		stopCluster(t, c)
	})

	// A role without CREATEDB, owning a database of its own.
	for _, stmt := range []string{"CREATE ROLE limited LOGIN", "CREATE DATABASE limited_db OWNER limited"} {
		if err := execSQL(ctx, srv.URL(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(srv.URLFor("limited_db"))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("limited")
	limited := u.String()

	t.Run("no CREATEDB, one region", func(t *testing.T) {
		c := startCluster(t, cluster.Config{DatabaseURL: limited})
		if got := c.Info().DatabaseURL; got != limited {
			t.Errorf("database %q, want the given %q", got, limited)
		}
		stopCluster(t, c)
	})

	t.Run("no CREATEDB, two regions", func(t *testing.T) {
		c, err := cluster.Start(ctx, cluster.Config{
			IdemdPath: idemdPath, DatabaseURL: limited, Regions: []string{"a", "b"}, Logger: testLogger(t),
		})
		if err == nil {
			_ = c.Stop(context.Background())
			t.Fatal("Start succeeded")
		}
		if !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("error %v, want permission denied", err)
		}
	})
}

func execSQL(ctx context.Context, dbURL, stmt string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]cluster.Config{
		"no idemd":           {},
		"missing idemd":      {IdemdPath: "/nonexistent/idemd"},
		"bad region":         {IdemdPath: idemdPath, Regions: []string{"EU West"}},
		"same database":      {IdemdPath: idemdPath, Regions: []string{"eu-west", "eu_west"}},
		"negative nodes":     {IdemdPath: idemdPath, NodesPerRegion: -1},
		"bad tenant":         {IdemdPath: idemdPath, Tenants: []string{"a=b"}},
		"tenant, space":      {IdemdPath: idemdPath, Tenants: []string{"tenant a"}},
		"bad operation":      {IdemdPath: idemdPath, Operations: []string{"orders", ".."}},
		"negative window":    {IdemdPath: idemdPath, ReplayWindow: -time.Second},
		"bad store mode":     {IdemdPath: idemdPath, StoreMode: "everywhere"},
		"negative etcd":      {IdemdPath: idemdPath, EtcdMembers: -1},
		"missing etcd":       {IdemdPath: idemdPath, EtcdMembers: 1, EtcdPath: "/nonexistent/etcd"},
		"negative ttl":       {IdemdPath: idemdPath, RegionLeaseTTL: -time.Second},
		"store ttl short":    {IdemdPath: idemdPath, StoreHATTL: 2 * time.Second},
		"store ttl part":     {IdemdPath: idemdPath, StoreHATTL: 5500 * time.Millisecond},
		"missing idemctl":    {IdemdPath: idemdPath, Provider: true, IdemctlPath: "/nonexistent/idemctl"},
		"ha without etcd":    {IdemdPath: idemdPath, StoreHA: true, StoreMode: cluster.StoreGlobal, Regions: []string{"a", "b"}},
		"ha, one region":     {IdemdPath: idemdPath, StoreHA: true, StoreMode: cluster.StoreGlobal, EtcdMembers: 1, EtcdPath: etcdPath},
		"store links, no ha": {IdemdPath: idemdPath, Proxied: true, ProxiedStoreOnly: true},
		"pgbouncer, ha": {IdemdPath: idemdPath, PgBouncer: true, StoreHA: true, StoreMode: cluster.StoreGlobal,
			Regions: []string{"a", "b"}, EtcdMembers: 1, EtcdPath: etcdPath},
		"pgbouncer, database url": {IdemdPath: idemdPath, PgBouncer: true, DatabaseURL: "postgres://x@127.0.0.1/db"},
		"pgbouncer, tls":          {IdemdPath: idemdPath, PgBouncer: true, TLS: true},
		"store links, no proxies": {IdemdPath: idemdPath, StoreHA: true, StoreMode: cluster.StoreGlobal, ProxiedStoreOnly: true,
			Regions: []string{"a", "b", "c"}, EtcdMembers: 1, EtcdPath: etcdPath},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := cluster.Start(context.Background(), cfg)
			if err == nil {
				_ = c.Stop(context.Background())
				t.Fatal("Start succeeded")
			}
			t.Log(err)
		})
	}
}

func TestFindBinary(t *testing.T) {
	pathDir := t.TempDir()
	exe := filepath.Join(pathDir, "idemd-test-tool")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", pathDir)
	if got, err := cluster.FindBinary("idemd-test-tool"); err != nil || got != exe {
		t.Errorf("FindBinary on PATH = %q, %v; want %q", got, err, exe)
	}

	// ./bin comes before PATH.
	wd := t.TempDir()
	if err := os.Mkdir(filepath.Join(wd, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(wd, "bin", "idemd-test-tool")
	if err := os.WriteFile(local, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(wd)
	if got, err := cluster.FindBinary("idemd-test-tool"); err != nil || got != local {
		t.Errorf("FindBinary in ./bin = %q, %v; want %q", got, err, local)
	}

	_, err := cluster.FindBinary("no-such-idem-binary")
	if err == nil || !strings.Contains(err.Error(), "`go build -o bin/ ./cmd/idemd ./cmd/idemctl && go build -o bin/etcd go.etcd.io/etcd/server/v3 && bin/idemctl up`") ||
		!errors.Is(err, exec.ErrNotFound) {
		t.Errorf("FindBinary of a missing binary: %v", err)
	}
}

// TestParentKilledLeavesNothing kills (SIGKILL) a process that started a
// cluster and expects every node, etcd member, the provider and PostgreSQL
// to go away with it.
func TestParentKilledLeavesNothing(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=1", envIdemd+"="+idemdPath, envIdemctl+"="+idemctlPath,
		envEtcd+"="+etcdPath, envStateDir+"="+stateDir(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %v\n%s", err, stderr.String())
	}
	var pids []int
	if err := json.Unmarshal([]byte(line), &pids); err != nil || len(pids) != 7 { // postgres, provider, 2 nodes, 3 etcd
		t.Fatalf("helper printed %q: %v", line, err)
	}
	for _, pid := range pids {
		if !procfs.Alive(pid) {
			t.Fatalf("pid %d of %v is not running before the kill", pid, pids)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for procfs.Alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d (of %v: postgres, provider, nodes, etcd) survived the SIGKILL of the process that started it", pid, pids)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// --- helpers ---

func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// stateDir returns a new directory that the postgres OS user can reach
// when the tests run as root (t.TempDir's parent has mode 0700); removed
// after the test.
func stateDir(tb testing.TB) string {
	tb.Helper()
	base, err := os.MkdirTemp("", "cluster-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(base, "state")
}

// startCluster starts a cluster with the test's idemd and logger; the
// cluster is stopped after the test if the test has not stopped it.
func startCluster(tb testing.TB, cfg cluster.Config) *cluster.Cluster {
	tb.Helper()
	cfg.IdemdPath = idemdPath
	if cfg.EtcdMembers > 0 {
		cfg.EtcdPath = etcdPath
	}
	if cfg.Provider {
		cfg.IdemctlPath = idemctlPath
	}
	cfg.Logger = testLogger(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("cluster of %d node(s), %d etcd member(s) started in %v", len(c.Nodes()), len(c.EtcdMembers()), time.Since(began).Round(time.Millisecond))
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			tb.Errorf("Stop: %v", err)
		}
	})
	return c
}

func stopCluster(tb testing.TB, c *cluster.Cluster) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	if err := c.Stop(ctx); err != nil {
		tb.Errorf("Stop: %v", err)
	}
	tb.Logf("cluster stopped in %v", time.Since(began).Round(time.Millisecond))
}

// clusterPids returns the pids of the cluster's processes (PostgreSQL, the
// provider, nodes, etcd members), checking that they run.
func clusterPids(tb testing.TB, c *cluster.Cluster) []int {
	tb.Helper()
	var pids []int
	if pid := c.PostgresPid(); pid != 0 {
		pids = append(pids, pid)
	}
	if p := c.Provider(); p != nil {
		pids = append(pids, p.Pid())
	}
	for _, p := range append(c.Nodes(), c.EtcdMembers()...) {
		pids = append(pids, p.Pid())
	}
	for _, pid := range pids {
		if pid <= 0 || !procfs.Alive(pid) {
			tb.Fatalf("pid %d of %v is not running", pid, pids)
		}
	}
	return pids
}

// assertGone checks that every pid has exited and been reaped.
func assertGone(tb testing.TB, pids []int) {
	tb.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			tb.Errorf("pid %d: kill(0) = %v, want ESRCH", pid, err)
		}
	}
}

// assertNoChildren checks that this process has no child process left.
func assertNoChildren(tb testing.TB) {
	tb.Helper()
	if kids := procfs.Children(os.Getpid()); len(kids) != 0 {
		tb.Errorf("child processes left: %v", kids)
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// postPayment sends the sample create-payment request.
func postPayment(tb testing.TB, baseURL, token, key, ref string) response {
	tb.Helper()
	return postPaymentTLS(tb, nil, baseURL, token, key, ref)
}

// postPaymentTLS is postPayment with a client TLS configuration.
func postPaymentTLS(tb testing.TB, tlsConfig *tls.Config, baseURL, token, key, ref string) response {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+"/payments", strings.NewReader(paymentBody(ref)))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConfig}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		tb.Fatalf("POST %s/payments: %v", baseURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: body}
}

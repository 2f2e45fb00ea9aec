package pgserver_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/procfs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startServer(t *testing.T, opts pgserver.Options) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	begin := time.Now()
	srv, err := pgserver.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("started pid %d at %s in %v", srv.Pid(), srv.URL(), time.Since(begin))
	t.Cleanup(func() {
		if err := srv.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return srv
}

func queryString(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func dataDirOf(t *testing.T, srv *pgserver.Server) string {
	t.Helper()
	return queryString(t, srv.URL(), "SHOW data_directory")
}

func assertGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postmaster pid %d after Stop: kill(pid, 0) = %v, want ESRCH", pid, err)
	}
}

func TestServer(t *testing.T) {
	srv := startServer(t, pgserver.Options{})
	ctx := context.Background()

	if got := queryString(t, srv.URL(), "SELECT 1::text"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
	// PostgreSQL's own default, as a production server has it: the store
	// names SERIALIZABLE in its BEGINs, and its tests show it there.
	if got := queryString(t, srv.URL(), "SHOW default_transaction_isolation"); got != "read committed" {
		t.Errorf("default_transaction_isolation = %q, want read committed", got)
	}
	if got := queryString(t, srv.URL(), "SHOW fsync"); got != "off" {
		t.Errorf("fsync = %q, want off", got)
	}
	if got := queryString(t, srv.URL(), "SHOW max_connections"); got != "200" {
		t.Errorf("max_connections = %q, want 200", got)
	}
	if got := queryString(t, srv.URL(), "SELECT inet_server_addr()::text"); got != "127.0.0.1/32" {
		t.Errorf("inet_server_addr() = %q, want 127.0.0.1/32", got)
	}

	const name = "Mixed Case-db"
	dbURL, err := srv.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	if dbURL != srv.URLFor(name) {
		t.Errorf("CreateDatabase URL = %q, want %q", dbURL, srv.URLFor(name))
	}
	if got := queryString(t, dbURL, "SELECT current_database()::text"); got != name {
		t.Errorf("current_database() = %q, want %q", got, name)
	}
	if _, err := srv.CreateDatabase(ctx, name); err == nil {
		t.Errorf("second CreateDatabase(%q) succeeded, want an error", name)
	}

	dataDir := dataDirOf(t, srv)
	pid := srv.Pid()
	// Hold a connection open (inside a transaction) across Stop: a fast
	// shutdown must terminate it rather than wait for it.
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}

	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := srv.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertGone(t, pid)
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data directory %s after Stop: stat err = %v, want not exist", dataDir, err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestSettingsAndFsync(t *testing.T) {
	srv := startServer(t, pgserver.Options{
		Fsync:    true,
		Settings: map[string]string{"max_connections": "50", "application_name": "pgserver test"},
	})
	for setting, want := range map[string]string{
		"fsync":              "on",
		"synchronous_commit": "on",
		"max_connections":    "50",
	} {
		if got := queryString(t, srv.URL(), "SHOW "+setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
}

// TestCallerDir checks a caller-supplied directory, long enough to force
// the socket elsewhere: the cluster survives Stop and is reused.
func TestCallerDir(t *testing.T) {
	dir := filepath.Join(tempDir(t), strings.Repeat("long-directory-name-", 5), "cluster")

	srv := startServer(t, pgserver.Options{Dir: dir})
	if _, err := srv.CreateDatabase(context.Background(), "kept"); err != nil {
		t.Fatal(err)
	}
	pid := srv.Pid()
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertGone(t, pid)
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		t.Fatalf("caller-supplied Dir not kept: %v", err)
	}

	srv = startServer(t, pgserver.Options{Dir: dir})
	if got := queryString(t, srv.URLFor("kept"), "SELECT current_database()::text"); got != "kept" {
		t.Errorf("reused cluster: current_database() = %q", got)
	}
}

func TestPortTaken(t *testing.T) {
	a := startServer(t, pgserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgserver.Start(ctx, pgserver.Options{Port: a.Port()})
	if err == nil {
		b.Stop(ctx)
		t.Fatalf("Start on the port of another server succeeded")
	}
	if !strings.Contains(err.Error(), "server log") {
		t.Errorf("error does not quote the server log: %v", err)
	}
	t.Logf("expected error: %v", err)
}

// TestStartCancelled cancels Start during initdb and checks that nothing
// is left behind.
func TestStartCancelled(t *testing.T) {
	for _, timeout := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			var logBuf bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			srv, err := pgserver.Start(ctx, pgserver.Options{Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
			if err == nil {
				srv.Stop(context.Background())
				t.Skipf("server started within %v", timeout)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Start with expiring context: %v, want DeadlineExceeded", err)
			}
			m := regexp.MustCompile(`data=(\S+)/data`).FindStringSubmatch(logBuf.String())
			if m == nil {
				t.Fatalf("no data directory in log:\n%s", logBuf.String())
			}
			if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Start left %s behind (stat: %v)", m[1], err)
			}
			if pids := processesMentioning(t, m[1]); len(pids) > 0 {
				t.Errorf("Start left processes %v behind", pids)
			}
		})
	}
}

// TestStartCancelledWhileStarting cancels Start while postgres starts up
// in an existing cluster and checks that no process is left behind.
func TestStartCancelledWhileStarting(t *testing.T) {
	dir := filepath.Join(tempDir(t), "cluster")
	srv := startServer(t, pgserver.Options{Dir: dir})
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for timeout := time.Millisecond; timeout < 2*time.Second; timeout *= 2 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		srv, err := pgserver.Start(ctx, pgserver.Options{Dir: dir})
		cancel()
		if err == nil {
			t.Logf("started within %v", timeout)
			if err := srv.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			break
		}
		cancelled++
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Start with %v timeout: %v, want DeadlineExceeded", timeout, err)
		}
		if pids := processesMentioning(t, dir); len(pids) > 0 {
			t.Fatalf("Start with %v timeout left processes %v behind", timeout, pids)
		}
	}
	if cancelled == 0 {
		t.Errorf("no Start was cancelled")
	}
}

// tempDir returns a new directory that the server's OS user can reach
// (t.TempDir's parent has mode 0700), removed at the end of the test.
func tempDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "pgserver-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return base
}

// processesMentioning lists processes whose command line contains s.
func processesMentioning(t *testing.T, s string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestParentKilled checks that the server dies with the process that
// started it: it runs this test binary as a helper that starts a server,
// SIGKILLs the helper and waits for the postmaster to go away.
func TestParentKilled(t *testing.T) {
	if os.Getenv("PGSERVER_TEST_HELPER") == "1" {
		srv, err := pgserver.Start(context.Background(), pgserver.Options{})
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		fmt.Println("READY", srv.Pid(), dataDirOf(t, srv))
		select {} // until killed
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestParentKilled$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGSERVER_TEST_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	var dataDir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "READY %d %s", &pid, &dataDir); err == nil {
			break
		}
		t.Logf("helper: %s", sc.Text())
	}
	if pid == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("helper did not start a server")
	}
	procs := append(procfs.Children(pid), pid)
	if len(procs) < 2 {
		t.Errorf("postmaster %d has no children", pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The data directory is left behind by design when the parent dies.
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(dataDir)) })

	deadline := time.Now().Add(20 * time.Second)
	for _, p := range procs {
		for procfs.Alive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("server process %d (postmaster %d) outlived the killed parent", p, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestNotInstalled(t *testing.T) {
	_, err := pgserver.Start(context.Background(), pgserver.Options{BinDir: t.TempDir()})
	if !errors.Is(err, pgserver.ErrNotInstalled) {
		t.Fatalf("Start with empty BinDir: %v, want ErrNotInstalled", err)
	}
	if !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Errorf("error does not say how to install: %v", err)
	}
}

func TestFindBinDir(t *testing.T) {
	dir, err := pgserver.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
}

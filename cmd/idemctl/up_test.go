package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemcoord/idem/cluster"
)

// TestUp builds idemd and idemctl once and runs "idemctl up" in process and
// as a real child process.
func TestUp(t *testing.T) {
	bin := upBuildBinaries(t)
	idemd := filepath.Join(bin, "idemd")

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"up", "extra"},
			{"up", "--nodes-per-region", "0"},
			{"up", "--regions", " , "},
			{"up", "--replay-window", "-1s"},
			{"up", "--no-such-flag"},
		} {
			var stderr bytes.Buffer
			env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
			if code := Run(context.Background(), args, env); code != 2 {
				t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, stderr.String())
			}
		}
	})

	t.Run("in process", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
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
		go func() { code <- Run(ctx, []string{"up", "--state-dir", dir, "--idemd", idemd}, env) }()

		info := upWaitForState(t, filepath.Join(dir, cluster.StateFile), code, &stderr)
		if len(info.Regions) != 2 || info.Regions[1].Name != "us-east" {
			t.Errorf("regions %+v, want eu-west and us-east from IDEM_REGIONS", info.Regions)
		}
		upCheckPayment(t, info)
		upCheckSummary(t, stdout.String(), info)

		cancel() // what SIGINT does through signal.NotifyContext
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", c, stderr.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("idemctl up did not return after its context ended")
		}
		if kids := upChildren(t, os.Getpid()); len(kids) != 0 {
			t.Errorf("child processes left: %v", kids)
		}
		if _, err := os.Stat(filepath.Join(dir, cluster.StateFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cluster.json after exit: %v, want it removed", err)
		}
	})

	t.Run("child process", func(t *testing.T) {
		dir := upStateDir(t)
		// No --idemd: idemctl finds the idemd next to it.
		cmd := exec.Command(filepath.Join(bin, "idemctl"), "up", "--state-dir", dir, "--nodes-per-region", "2")
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
		t.Logf("idemctl up: cluster.json after %v", time.Since(began).Round(time.Millisecond))
		upCheckPayment(t, info)
		upCheckSummary(t, stdout.String(), info)
		kids := upChildren(t, cmd.Process.Pid)
		if len(kids) != 3 { // PostgreSQL and two nodes
			t.Errorf("idemctl up has upChildren %v, want PostgreSQL and 2 nodes", kids)
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

// upBuildBinaries builds idemd and idemctl into a temporary directory.
func upBuildBinaries(tb testing.TB) string {
	tb.Helper()
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goCmd); err != nil {
		if goCmd, err = exec.LookPath("go"); err != nil {
			tb.Fatalf("find the go command: %v", err)
		}
	}
	dir := tb.TempDir()
	cmd := exec.Command(goCmd, "build", "-o", dir+string(filepath.Separator),
		"github.com/idemcoord/idem/cmd/idemd", "github.com/idemcoord/idem/cmd/idemctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
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

// upCheckPayment creates a payment on the first region and replays it.
func upCheckPayment(tb testing.TB, info cluster.Info) {
	tb.Helper()
	if len(info.Regions) == 0 || info.Tokens["tenant-a"] == "" || info.DatabaseURL == "" {
		tb.Fatalf("cluster.json lacks regions, a tenant-a token or the database: %+v", info)
	}
	for i, want := range []string{"", "true"} {
		req, err := http.NewRequest(http.MethodPost, info.Regions[0].URL+"/payments", strings.NewReader(upSamplePayment))
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+info.Tokens["tenant-a"])
		req.Header.Set("Idempotency-Key", "abc-123")
		req.Header.Set("Content-Type", "application/json")
		tr := &http.Transport{DisableKeepAlives: true}
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		tr.CloseIdleConnections()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != want {
			tb.Errorf("POST %d: %s, Idempotent-Replayed %q (want 201, %q): %s", i+1, resp.Status, resp.Header.Get("Idempotent-Replayed"), want, body)
		}
	}
}

// upCheckSummary checks that idemctl up printed the endpoints, tokens and a
// curl command.
func upCheckSummary(tb testing.TB, out string, info cluster.Info) {
	tb.Helper()
	want := []string{info.DatabaseURL, "Press Ctrl-C",
		"curl -s -X POST " + info.Regions[0].URL + "/payments -H 'Authorization: Bearer " + info.Tokens["tenant-a"] + "'" +
			" -H 'Idempotency-Key: abc-123' -H 'Content-Type: application/json' -d '" + upSamplePayment + "'"}
	for _, r := range info.Regions {
		want = append(want, r.Nodes...)
	}
	for tenant, token := range info.Tokens {
		want = append(want, tenant+"  "+token)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			tb.Errorf("summary lacks %q:\n%s", w, out)
		}
	}
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

// upChildren lists the processes whose parent is ppid.
func upChildren(tb testing.TB, ppid int) []int {
	tb.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[1] == strconv.Itoa(ppid) {
			pids = append(pids, pid)
		}
	}
	return pids
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

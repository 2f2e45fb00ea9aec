package examples_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/testbin"
)

var idemdBin, upstreamBin, grpcServerBin, grpcClientBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemdBin, upstreamBin = filepath.Join(dir, "idemd"), filepath.Join(dir, "upstream")
	grpcServerBin, grpcClientBin = filepath.Join(dir, "grpc-server"), filepath.Join(dir, "grpc-client")
	for bin, pkg := range map[string]string{idemdBin: "github.com/idemcoord/idem/cmd/idemd", upstreamBin: "github.com/idemcoord/idem/examples/sidecar/upstream",
		grpcServerBin: "github.com/idemcoord/idem/examples/grpc/server", grpcClientBin: "github.com/idemcoord/idem/examples/grpc/client"} {
		if err := testbin.Build(bin, pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a child process stopped (SIGTERM, then waited for) at the
// test's end; its output is logged if the test fails. The channel is closed
// when the process has exited.
func start(t *testing.T, name string, stdout io.Writer, bin string, args ...string) <-chan struct{} {
	t.Helper()
	log := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = log
	cmd.Stdout = log
	if stdout != nil {
		cmd.Stdout = io.MultiWriter(log, stdout)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if t.Failed() {
			t.Logf("%s output:\n%s", name, log)
		}
	})
	return exited
}

// startUpstream runs the example upstream on a port of its choosing and
// returns its URL, read from the line it prints.
func startUpstream(t *testing.T) string {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	start(t, "upstream", pw, upstreamBin, "--listen", "127.0.0.1:0")
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("upstream: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "upstream listening on ")
	if !ok {
		t.Fatalf("upstream printed %q", line)
	}
	return url
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

// startIdemd runs idemd on a new database with one tenant, acme, whose
// token is dev-token, and waits until it is ready.
func startIdemd(t *testing.T, extra ...string) string {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("dev-token=acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	exited := start(t, "idemd", nil, idemdBin, append([]string{"--listen", addr, "--database-url", pgtest.NewDatabase(t),
		"--auth-tokens-file", tokens}, extra...)...)
	url := "http://" + addr
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		select {
		case <-exited:
			t.Fatal("idemd exited before it was ready")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// runScript runs a walkthrough script with bash and fails the test if it
// fails.
func runScript(t *testing.T, script string, env ...string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("SKIP: the walkthroughs call curl, which is not installed")
	}
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	t.Logf("%s:\n%s", script, out)
	if !strings.Contains(string(out), "walkthrough passed") {
		t.Fatalf("%s did not finish:\n%s", script, out)
	}
}

// TestSidecarWalkthrough runs examples/sidecar/walkthrough.sh against idemd
// in front of the example upstream, as README.md starts them.
func TestSidecarWalkthrough(t *testing.T) {
	up := startUpstream(t)
	node := startIdemd(t, "--proxy-routes",
		"POST /transfers=create_transfer@"+up+";lookup="+up+"/transfers/by-key/{derivedKey}")
	runScript(t, filepath.Join("sidecar", "walkthrough.sh"), "IDEM_URL="+node, "IDEM_TOKEN=dev-token", "UPSTREAM_URL="+up)
	// Run twice: the script stands on its own against a used upstream.
	runScript(t, filepath.Join("sidecar", "walkthrough.sh"), "IDEM_URL="+node, "IDEM_TOKEN=dev-token", "UPSTREAM_URL="+up)
}

// TestCoordinationWalkthrough runs examples/coordination/walkthrough.sh
// against a node that declares the operation.
func TestCoordinationWalkthrough(t *testing.T) {
	node := startIdemd(t, "--operations", "create_transfer")
	runScript(t, filepath.Join("coordination", "walkthrough.sh"), "IDEM_URL="+node, "IDEM_TOKEN=dev-token")
}

// TestGRPCWalkthrough runs examples/grpc's server on a new database, losing
// the first answer of each key, and its client, as README.md starts them:
// the client checks what it got and prints "walkthrough passed".
func TestGRPCWalkthrough(t *testing.T) {
	addr := freeAddr(t)
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	cmd := exec.Command(grpcServerBin, "--listen", addr, "--lose", "1")
	cmd.Env = append(os.Environ(), "API_TOKEN=dev-token", "DATABASE_URL="+pgtest.NewDatabase(t))
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(log, pw), log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("server output:\n%s", log)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on ") {
		t.Fatalf("server printed %q (%v)", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	for range 2 {
		client := exec.Command(grpcClientBin, "--target", addr, "--calls", "12", "--parallel", "4")
		client.Env = append(os.Environ(), "API_TOKEN=dev-token")
		out, err := client.CombinedOutput()
		t.Logf("client:\n%s", out)
		if err != nil || !strings.Contains(string(out), "walkthrough passed") {
			t.Fatalf("client: %v", err)
		}
	}
}

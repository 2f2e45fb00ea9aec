// Package etcdtest runs a real, single-member etcd server for tests, as a
// process of the etcd binary built from the pinned module
// (go.etcd.io/etcd/server/v3), so that tests exercise genuine etcd lease,
// revision and transaction semantics instead of a mock, and the library's
// module needs no requirement on the etcd server.
//
// Each call to Start gets its own member in its own temporary directory on
// free 127.0.0.1 ports, and stops it in tb.Cleanup:
//
//	srv := etcdtest.Start(t)
//	cli := srv.Client(t) // closed in t.Cleanup, before the member stops
//
// The binary is $IDEM_ETCD_BIN when set; otherwise it is built once with
// `go build go.etcd.io/etcd/server/v3` in the repository's workspace (the
// tests module pins the server at the client's version) and kept in the
// temporary directory under the etcd version's name, so later test
// processes reuse it.
//
// Clients reach the member through a loopback TCP relay owned by the
// Server, so that Stop can cut every client connection at once; Stop then
// kills the process (SIGKILL), as a crash would. Link gives one client a
// relay of its own that a test can cut and heal, to partition one node
// from etcd while the others keep it.
//
// The member logs at warn level into a bounded in-memory buffer that is
// printed with tb.Log only if the test failed, so passing runs stay quiet.
//
// # Goroutines
//
// When Stop (or the cleanup) returns, the process, its relays and their
// goroutines are gone, and clients made by Client or NewClient leave none
// once closed: callers can use goleak.VerifyTestMain or goleak.VerifyNone
// with no etcd-specific ignores.
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idemcoord/idem/internal/freeport"
	"github.com/idemcoord/idem/internal/testbin"
)

const (
	// readyTimeout bounds how long Start waits for the member to become
	// ready (elected and serving).
	readyTimeout = 30 * time.Second
	// dialTimeout is the clients' connection timeout.
	dialTimeout = 5 * time.Second
	// maxLog bounds the in-memory server log kept for failing tests.
	maxLog = 256 << 10
	// startAttempts bounds the retries when a port picked for the member
	// was taken by another process before the member bound it.
	startAttempts = 3
)

// Server is a running etcd member.
type Server struct {
	// Endpoints are the client URLs (http://127.0.0.1:PORT, https:// with
	// WithClientCertAuth) of the relay in front of the member; pass them to
	// clientv3.Config.
	Endpoints []string

	scheme   string
	target   string // the member's own client address
	dir      string // the member's data directory, removed by Stop
	cmd      *exec.Cmd
	exited   chan struct{}
	relays   []*relay
	mu       sync.Mutex
	log      *logBuffer
	stopOnce sync.Once
}

// Option configures Start.
type Option func(*options)

type options struct {
	certFile, keyFile, caFile string
}

// WithClientCertAuth serves clients over TLS with certFile and keyFile
// (valid for 127.0.0.1) and requires client certificates issued by the CA
// of caFile (etcd's --client-cert-auth). Endpoints are then https:// and
// Config, Client and NewClient callers must add a tls.Config.
func WithClientCertAuth(certFile, keyFile, caFile string) Option {
	return func(o *options) { o.certFile, o.keyFile, o.caFile = certFile, keyFile, caFile }
}

// Start starts a single-member etcd in a temporary directory on free
// 127.0.0.1 ports (client, peer, metrics and relay), waits until it is
// ready (its /health answers true), and stops it in tb.Cleanup. It fails
// the test (tb.Fatal) if the member does not become ready within 30
// seconds.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	bin := binary(tb)
	s, err := New(bin, opts...)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(func() {
		s.Stop()
		if tb.Failed() {
			if out := s.log.String(); out != "" {
				tb.Logf("etcdtest: etcd log (warn and above):\n%s", out)
			}
		}
	})
	return s
}

// New starts a member of the etcd binary bin as Start does, for callers
// with no testing.TB (a TestMain); they call Stop. Binary gives bin.
func New(bin string, opts ...Option) (*Server, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var s *Server
	var err error
	for range startAttempts {
		if s, err = start(bin, o); err == nil || !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	r, err := newRelay(s.target)
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.relays = append(s.relays, r)
	s.Endpoints = []string{s.scheme + "://" + r.addr()}
	return s, nil
}

// errPortTaken marks a start that failed because a port was taken.
var errPortTaken = errors.New("port taken")

// start runs one member and waits until it is ready.
func start(bin string, o options) (*Server, error) {
	dir, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	ports, err := freeport.Distinct(3)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	port := func(i int) string { return strconv.Itoa(ports[i]) }
	client, peer, metrics := "127.0.0.1:"+port(0), "http://127.0.0.1:"+port(1), "http://127.0.0.1:"+port(2)
	scheme := "http"
	args := []string{
		"--name", "etcdtest", "--data-dir", filepath.Join(dir, "data"),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcdtest=" + peer, "--initial-cluster-token", "etcdtest",
		"--listen-metrics-urls", metrics,
		// Tests are not durable; skipping fsync keeps them fast on slow disks.
		"--unsafe-no-fsync",
		// Tests that enable auth hash throwaway passwords: etcd's default
		// bcrypt cost takes seconds per authentication on a loaded machine,
		// long enough for a client's dial timeout to pass. 4 is bcrypt's
		// minimum.
		"--bcrypt-cost", "4",
		// A lone member needs no failure detection: short ticks make it
		// elect itself within ~100ms and lower etcd's minimum lease TTL to
		// 1 second (etcd raises a granted TTL to 1.5 election timeouts,
		// rounded up).
		"--heartbeat-interval", "10", "--election-timeout", "100",
		"--log-level", "warn",
	}
	if o.certFile != "" {
		scheme = "https"
		args = append(args, "--cert-file", o.certFile, "--key-file", o.keyFile,
			"--trusted-ca-file", o.caFile, "--client-cert-auth")
	}
	url := scheme + "://" + client
	args = append(args, "--listen-client-urls", url, "--advertise-client-urls", url)

	s := &Server{scheme: scheme, target: client, dir: dir, log: &logBuffer{max: maxLog}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for {
		if healthy(ctx, metrics+"/health") {
			return s, nil
		}
		select {
		case <-s.exited:
			_ = os.RemoveAll(dir)
			out := s.log.String()
			if strings.Contains(out, "address already in use") {
				return nil, fmt.Errorf("%w: %s", errPortTaken, out)
			}
			return nil, fmt.Errorf("etcd exited before it was ready (%v):\n%s", s.cmd.ProcessState, out)
		case <-ctx.Done():
			s.kill()
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("etcd not ready after %v:\n%s", readyTimeout, s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthy reports whether etcd's /health answers that the member serves.
func healthy(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte(`"health":"true"`))
}

// binary is Binary for a test.
func binary(tb testing.TB) string {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return bin
}

// Binary returns the etcd server binary: $IDEM_ETCD_BIN, or one built from
// the pinned module and cached under the etcd version's name.
func Binary() (string, error) {
	if bin := os.Getenv("IDEM_ETCD_BIN"); bin != "" {
		return bin, nil
	}
	version, err := testbin.ModuleVersion("go.etcd.io/etcd/server/v3")
	if err != nil {
		return "", fmt.Errorf("%w (set IDEM_ETCD_BIN to use a built etcd)", err)
	}
	dir := filepath.Join(os.TempDir(), "idem-etcdtest")
	bin := filepath.Join(dir, "etcd-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Built under a name of its own and renamed, so that test processes
	// building at once never run a half-written file.
	tmp, err := os.CreateTemp(dir, "build-*")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()
	if err := testbin.Build(tmp.Name(), "go.etcd.io/etcd/server/v3"); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("build the etcd server (set IDEM_ETCD_BIN to use a built one): %w", err)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// Stop stops the member at once, as a crash would: it cuts every client
// connection, then kills the process and waits for it. It is safe to call
// more than once; the cleanup registered by Start calls it too. Clients
// stay open (their calls fail until their context ends) and are closed by
// their own cleanup.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		relays := s.relays
		s.mu.Unlock()
		for _, r := range relays {
			r.close()
		}
		s.kill()
		_ = os.RemoveAll(s.dir)
	})
}

// kill ends the process and waits until it has exited.
func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Link is a relay of its own in front of the member, for one client that a
// test partitions from etcd (Cut) and reconnects (Heal) while other
// clients keep their connections.
type Link struct {
	// Endpoint is the link's client URL.
	Endpoint string
	r        *relay
}

// Link starts a relay in front of the member; Stop closes it.
func (s *Server) Link(tb testing.TB) *Link {
	tb.Helper()
	r, err := newRelay(s.target)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	s.mu.Lock()
	s.relays = append(s.relays, r)
	s.mu.Unlock()
	return &Link{Endpoint: s.scheme + "://" + r.addr(), r: r}
}

// Cut closes every connection through the link and refuses new ones (they
// are accepted and closed at once) until Heal.
func (l *Link) Cut() { l.r.setCut(true) }

// Heal lets connections through the link again.
func (l *Link) Heal() { l.r.setCut(false) }

// Config returns a client configuration for this server: its endpoints, a
// 5-second dial timeout and a no-op logger. Tests that need extra dial
// options (for example gRPC interceptors) adjust it and call NewClient.
func (s *Server) Config() clientv3.Config {
	return clientv3.Config{
		Endpoints:   append([]string(nil), s.Endpoints...),
		DialTimeout: dialTimeout,
		Logger:      zap.NewNop(),
	}
}

// Client returns a new client of this server, closed in tb.Cleanup (which
// runs before the server's own cleanup, since cleanups run last-in
// first-out).
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return NewClient(tb, s.Config())
}

// NewClient returns a client made from cfg, closed in tb.Cleanup. Closing
// it earlier (to simulate a crashed or partitioned process) is fine.
func NewClient(tb testing.TB, cfg clientv3.Config) *clientv3.Client {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatalf("etcdtest: new client for %v: %v", cfg.Endpoints, err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// logBuffer is a concurrency-safe buffer that keeps the first max bytes.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	max     int
	dropped int
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room < len(p) {
		if room > 0 {
			b.buf.Write(p[:room])
		}
		b.dropped += len(p) - max(room, 0)
		return len(p), nil
	}
	b.buf.Write(p)
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped > 0 {
		return fmt.Sprintf("%s\n... %d bytes dropped", b.buf.String(), b.dropped)
	}
	return b.buf.String()
}

// relay forwards loopback TCP connections to target and can cut them all.
type relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	cut    bool
	conns  map[net.Conn]struct{}
}

func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay for %s: %w", target, err)
	}
	r := &relay{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				// Accept failed for another reason; stop relaying
				// rather than spin. Clients see refused connections.
				_ = r.ln.Close()
			}
			return
		}
		r.wg.Add(1)
		go r.pipe(c)
	}
}

// pipe copies between c and a new connection to the target until either
// side ends or the relay is closed.
func (r *relay) pipe(c net.Conn) {
	defer r.wg.Done()
	u, err := net.DialTimeout("tcp", r.target, dialTimeout)
	if err != nil {
		_ = c.Close()
		return
	}
	if !r.track(c, u) {
		_ = c.Close()
		_ = u.Close()
		return
	}
	defer r.untrack(c, u)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(u, c)
		_ = u.Close()
		_ = c.Close()
	}()
	_, _ = io.Copy(c, u)
	_ = c.Close()
	_ = u.Close()
	<-done
}

// setCut cuts every connection and refuses new ones (cut), or lets them
// through again.
func (r *relay) setCut(cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = cut
	if cut {
		for c := range r.conns {
			_ = c.Close()
		}
	}
}

func (r *relay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.cut {
		return false
	}
	for _, c := range conns {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *relay) untrack(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		delete(r.conns, c)
	}
}

// close stops accepting, cuts every connection and waits for the relay's
// goroutines.
func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

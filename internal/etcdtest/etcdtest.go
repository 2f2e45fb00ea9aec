// Package etcdtest runs a real, single-member etcd inside the test process
// (go.etcd.io/etcd/server/v3/embed) so that tests exercise genuine etcd
// lease, revision and transaction semantics instead of a mock.
//
// Each call to Start gets its own member in its own temporary directory,
// listening on free 127.0.0.1 ports picked by the kernel, and stops it in
// tb.Cleanup:
//
//	srv := etcdtest.Start(t)
//	cli := srv.Client(t) // closed in t.Cleanup, before the member stops
//
// Clients reach the member through a loopback TCP relay owned by the
// Server, so that Stop can cut every client connection at once, as a
// crashed etcd would. (etcd's own graceful shutdown waits up to its 5s
// request timeout for open streams such as lease keepalives.)
//
// The member logs at warn level into a bounded in-memory buffer that is
// printed with tb.Log only if the test failed, so passing runs stay quiet.
// Start sets no process-wide loggers (gRPC's or zap's globals).
//
// # Goroutines
//
// When Stop (or the cleanup) returns, the member, its relay and their
// goroutines are gone, and clients made by Client or NewClient leave none
// once closed: under -race, go.uber.org/goleak finds nothing left, so
// callers can use goleak.VerifyTestMain or goleak.VerifyNone with no
// etcd-specific ignores. goleak's default retry window covers the few
// milliseconds gRPC takes to wind down a closed client's connection
// goroutines. (Checked against etcd v3.7.3; if a future version leaves
// goroutines behind, name their top functions in goleak.IgnoreTopFunction
// here.)
package etcdtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	// readyTimeout bounds how long Start waits for the member to become
	// ready (elected and serving).
	readyTimeout = 30 * time.Second
	// dialTimeout is the clients' connection timeout.
	dialTimeout = 5 * time.Second
	// maxLog bounds the in-memory server log kept for failing tests.
	maxLog = 256 << 10
)

// Server is a running embedded etcd member.
type Server struct {
	// Endpoints are the client URLs (http://127.0.0.1:PORT, https:// with
	// WithClientCertAuth) of the relay in front of the member; pass them to
	// clientv3.Config.
	Endpoints []string

	etcd     *embed.Etcd
	relays   []*relay
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

// Start starts a single-member embedded etcd in a temporary directory on
// free 127.0.0.1 ports (client, peer and relay), waits until it is ready
// (<-Server.ReadyNotify()), and stops it in tb.Cleanup. It fails the test
// (tb.Fatal) if the member does not become ready within 30 seconds.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	dir := tb.TempDir() // registered first, so removed after the server stops
	var o options
	for _, opt := range opts {
		opt(&o)
	}

	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = dir
	// Port 0: the kernel picks free ports at bind time, so there is no
	// window in which another process can take a port we probed.
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	clientURL := loopback
	if o.certFile != "" {
		clientURL.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.certFile, KeyFile: o.keyFile, TrustedCAFile: o.caFile, ClientCertAuth: true}
	}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{loopback}
	cfg.AdvertisePeerUrls = []url.URL{loopback}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "etcdtest"
	// Tests are not durable; skipping fsync keeps them fast on slow disks.
	cfg.UnsafeNoFsync = true
	// Tests that enable auth hash throwaway passwords: etcd's default bcrypt
	// cost takes seconds per authentication on a loaded machine, long
	// enough for a client's dial timeout to pass. 4 is bcrypt's minimum.
	cfg.BcryptCost = 4
	// A lone member needs no failure detection: short ticks make it elect
	// itself within ~100ms and lower etcd's minimum lease TTL to 1 second
	// (etcd raises a granted TTL to 1.5 election timeouts, rounded up).
	cfg.TickMs = 10
	cfg.ElectionMs = 100

	buf := &logBuffer{max: maxLog}
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(buf))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatalf("etcdtest: start embedded etcd: %v\n%s", err, buf.String())
	}
	s := &Server{etcd: e, log: buf}
	tb.Cleanup(func() {
		s.Stop()
		if tb.Failed() {
			if out := buf.String(); out != "" {
				tb.Logf("etcdtest: embedded etcd log (warn and above):\n%s", out)
			}
		}
	})

	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		tb.Fatalf("etcdtest: embedded etcd failed before ready: %v\n%s", err, buf.String())
	case <-time.After(readyTimeout):
		tb.Fatalf("etcdtest: embedded etcd not ready after %v\n%s", readyTimeout, buf.String())
	}

	for _, l := range e.Clients {
		r, err := newRelay(l.Addr().String())
		if err != nil {
			tb.Fatalf("etcdtest: %v", err)
		}
		s.relays = append(s.relays, r)
		s.Endpoints = append(s.Endpoints, clientURL.Scheme+"://"+r.addr())
	}
	if len(s.Endpoints) == 0 {
		tb.Fatal("etcdtest: embedded etcd has no client listener")
	}
	return s
}

// Stop stops the member at once, as a crash would: it cuts every client
// connection, then shuts etcd down and waits for its goroutines to exit.
// It is safe to call more than once; the cleanup registered by Start
// calls it too. Clients stay open — their calls fail until their context
// ends — and are closed by their own cleanup.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		for _, r := range s.relays {
			r.close()
		}
		s.etcd.Close()
		// Close closes Err() once every server goroutine is done.
		for range s.etcd.Err() {
		}
	})
}

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

// newLogger returns a warn-level console logger writing into buf.
func newLogger(buf *logBuffer) *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	core := zapcore.NewCore(enc, zapcore.AddSync(buf), zap.WarnLevel)
	return zap.New(core)
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

func (r *relay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
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

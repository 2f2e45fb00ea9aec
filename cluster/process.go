package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// readyPoll is the delay between readiness probes.
	readyPoll = 25 * time.Millisecond
	// probeTimeout bounds one readiness probe.
	probeTimeout = 2 * time.Second
	// logTailBytes is how much of a process's log errors quote.
	logTailBytes = 4096
)

// errAddrInUse marks a process that exited during startup because its
// port was taken.
var errAddrInUse = errors.New("address already in use")

// Kinds of Process.
const (
	KindNode     = "node"        // an idemd node of a region
	KindEtcd     = "etcd member" // a member of the etcd cluster
	KindProvider = "provider"    // the payment provider simulator
	// The docker environment's own containers (Config.Docker).
	KindStore = "store" // PostgreSQL
	KindWAN   = "wan"   // the toxiproxy server between the networks
)

// Process is one child process of a Cluster (an idemd node, an etcd member
// or the provider simulator): a fixed command line that can be started,
// signalled, killed and started again on the same ports. Its methods are
// safe for concurrent use. A Process belongs to its Cluster, whose Stop
// stops it; there is nothing to close.
type Process struct {
	kind         string // KindNode, KindEtcd or KindProvider
	name         string
	region       string // nodes only
	index        int
	path         string
	argv         func(addr string) []string // the command line for a listen address
	env          []string
	addr         string // host:port; fixed after the cluster has started
	readyPath    string // GET path that answers 200 once ready
	logPath      string
	readyTimeout time.Duration
	stopGrace    time.Duration
	log          *slog.Logger
	// scheme is "http" or "https" (Config.TLS); tlsConfig, with https,
	// is the probes' client configuration.
	scheme    string
	tlsConfig *tls.Config
	// ctr, in the docker environment, is the container the command runs
	// in: the child is the docker CLI running it in the foreground, and
	// addr is the container's own, fixed address.
	ctr *container
	// onAddr, if set, is called by firstStart with each address it picks
	// (a new one when the last was taken), before the child starts there.
	onAddr func(addr string) error

	mu     sync.Mutex // guards cur, addr and closed
	cur    *run       // nil before the first start
	closed bool       // the cluster is stopping: no more starts
}

// run is one execution of a Process's command.
type run struct {
	cmd      *exec.Cmd
	pid      int
	logStart int64         // offset of this run's output in the log file
	done     chan struct{} // closed once the child has been reaped
	err      error         // cmd.Wait's result; read after done is closed
}

func (r *run) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Name returns the process's name, which also names its log file
// (logs/<name>.log): "<region>-<index>" for a node, "etcd-m<index>" for an
// etcd member, "provider" for the provider simulator.
func (p *Process) Name() string { return p.name }

// Kind returns KindNode, KindEtcd or KindProvider (KindStore or KindWAN for
// the docker environment's own containers).
func (p *Process) Kind() string { return p.kind }

// Region returns a node's region, or, in the docker environment, the
// region whose network an etcd member is on ("" for other processes).
func (p *Process) Region() string { return p.region }

// Index returns a node's index within its region, or an etcd member's
// index, from 0.
func (p *Process) Index() int { return p.index }

// Addr returns the process's (client) listen address, 127.0.0.1:PORT: the
// HTTP address of a node or of the provider, the client address of an etcd
// member. It stays the same across restarts.
func (p *Process) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// URL returns the base URL of Addr, http://127.0.0.1:PORT (an etcd
// member's client URL), https:// in a cluster with Config.TLS.
func (p *Process) URL() string {
	if p.scheme == "" {
		return "http://" + p.Addr()
	}
	return p.scheme + "://" + p.Addr()
}

// probeClient returns a client for probing the process once, and the
// function that releases it.
func (p *Process) probeClient() (*http.Client, func()) {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: p.tlsConfig}
	return &http.Client{Transport: tr, Timeout: probeTimeout}, tr.CloseIdleConnections
}

// LogPath returns the file that receives the process's stdout and stderr.
// Every start appends a "=== cluster:" marker line and then its output.
func (p *Process) LogPath() string { return p.logPath }

// what names the process in messages: "node eu-west-0", "etcd member
// etcd-m1", "provider".
func (p *Process) what() string {
	if p.kind == p.name {
		return p.name
	}
	return p.kind + " " + p.name
}

// Pid returns the process id of the most recently started child, which may
// have exited since (see Running), or 0 if it was never started.
func (p *Process) Pid() int {
	if r := p.current(); r != nil {
		return r.pid
	}
	return 0
}

// Running reports whether the most recently started child has not exited
// yet (a stopped, SIGSTOPped child counts as running).
func (p *Process) Running() bool {
	r := p.current()
	return r != nil && !r.exited()
}

// Exited returns a channel closed once the most recently started child has
// exited and been reaped. A later Restart does not close or reuse it: call
// Exited again for the new child. Before the first start it returns a
// closed channel.
func (p *Process) Exited() <-chan struct{} {
	if r := p.current(); r != nil {
		return r.done
	}
	c := make(chan struct{})
	close(c)
	return c
}

// Wait waits until the most recently started child exits or ctx ends. It
// returns the child's exit error (nil for exit status 0, an *exec.ExitError
// otherwise) or ctx.Err().
func (p *Process) Wait(ctx context.Context) error {
	r := p.current()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signal sends sig to the child's process group (the child and anything it
// started), for example syscall.SIGSTOP and syscall.SIGCONT to pause and
// resume a node. The error wraps os.ErrProcessDone if the child is not
// running.
func (p *Process) Signal(sig syscall.Signal) error {
	r := p.current()
	if r == nil || r.exited() {
		return fmt.Errorf("cluster: signal %s: %w", p.what(), os.ErrProcessDone)
	}
	if p.ctr != nil {
		if err := p.ctr.signal(sig); err != nil {
			return fmt.Errorf("cluster: signal %s: %w", p.what(), err)
		}
		return nil
	}
	if err := syscall.Kill(-r.pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("cluster: signal %s: %w", p.what(), os.ErrProcessDone)
		}
		return fmt.Errorf("cluster: signal %s: %w", p.what(), err)
	}
	return nil
}

// Kill sends SIGKILL to the child's process group and returns once the
// child has been reaped: a crash, as far as the process is concerned. It
// returns nil if the child had already exited.
func (p *Process) Kill() error {
	r := p.current()
	if r == nil || r.exited() {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-r.done
	return nil
}

// Stop shuts the child down gracefully: SIGTERM (and SIGCONT, in case it is
// paused), then SIGKILL once the cluster's stop grace period has passed or
// ctx has ended. It returns once the child has been reaped; nil if the child
// exited with status 0 on SIGTERM (or died of the SIGTERM itself, as etcd
// does once it has shut down) or had already exited, an error if it had to
// be killed or exited with another status.
func (p *Process) Stop(ctx context.Context) error {
	r := p.current()
	if r == nil || r.exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	grace := time.NewTimer(p.stopGrace)
	defer grace.Stop()
	var why string
	select {
	case <-r.done:
		if r.err != nil && !diedOf(r.err, syscall.SIGTERM) {
			return fmt.Errorf("cluster: %s exited with %w on SIGTERM\n%s", p.what(), r.err, p.logTail(r))
		}
		return nil
	case <-grace.C:
		why = fmt.Sprintf("did not exit within %v of SIGTERM", p.stopGrace)
	case <-ctx.Done():
		why = fmt.Sprintf("did not exit on SIGTERM before the context ended (%v)", ctx.Err())
	}
	if err := p.Kill(); err != nil {
		return err
	}
	return fmt.Errorf("cluster: %s %s; killed", p.what(), why)
}

// diedOf reports whether a cmd.Wait error says the child was killed by sig.
func diedOf(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Restart starts the process's command again, on the same ports, and waits
// until it is ready; if the child is still running it is stopped first as by
// Stop. Use it after Kill to simulate a crashed process coming back (an
// etcd member rejoins with its data directory). ctx
// bounds stopping and the readiness wait (itself bounded by the cluster's
// ready timeout); if the new child does not become ready it is killed and
// the error quotes the end of its log. Restart fails once the cluster's Stop
// has begun.
func (p *Process) Restart(ctx context.Context) error {
	if err := p.Stop(ctx); err != nil {
		p.log.Warn("cluster: restart: stop", "process", p.Name(), "err", err)
	}
	if err := p.start(); err != nil {
		return err
	}
	if err := p.WaitReady(ctx); err != nil {
		_ = p.Kill()
		return err
	}
	return nil
}

// WaitReady polls the process until it answers 200: GET /readyz of a node,
// GET /health of an etcd member (which needs a leader and a quorum), GET
// /healthz of the provider. It fails if the child exits first, if ctx ends,
// or after the cluster's ready timeout; the error then quotes the end of the
// process's log.
func (p *Process) WaitReady(ctx context.Context) error {
	r := p.current()
	if r == nil {
		return fmt.Errorf("cluster: %s was never started", p.what())
	}
	ctx, cancel := context.WithTimeout(ctx, p.readyTimeout)
	defer cancel()
	client, release := p.probeClient()
	defer release()
	url := p.URL() + p.readyPath
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	var last error
	for {
		last = probe(ctx, client, url)
		if last == nil {
			// Another process may have taken the port before the child
			// could bind it (and then answer for it): the child must be
			// the one listening.
			if p.ctr != nil {
				return nil // the container's address is its own
			}
			owned, err := listensOn(r.pid, p.Addr())
			if owned || (err != nil && !errors.Is(err, errNoSocket)) { // no /proc: trust the probe
				return nil
			}
			last = fmt.Errorf("%s answers, but another process listens on %s", url, p.Addr())
		}
		select {
		case <-r.done:
			tail := p.logTail(r)
			if strings.Contains(tail, "address already in use") {
				return fmt.Errorf("cluster: %s on %s: %w\n%s", p.what(), p.Addr(), errAddrInUse, tail)
			}
			return fmt.Errorf("cluster: %s exited before it was ready (%v)\n%s", p.what(), r.err, tail)
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s not ready: %w (last probe: %v)\n%s", p.what(), ctx.Err(), last, p.logTail(r))
		case <-tick.C:
		}
	}
}

// probe asks url once and returns nil on 200.
func probe(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

func (p *Process) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// close prevents later starts; Cluster.Stop calls it before stopping the
// process, so that a concurrent Restart cannot leave a child behind.
func (p *Process) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
}

// setAddr changes the listen address before the first successful start.
func (p *Process) setAddr(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addr = addr
}

// start starts the command without waiting for readiness. It fails if the
// previous child is still running.
func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("cluster: start %s: the cluster is stopped", p.what())
	}
	if p.cur != nil && !p.cur.exited() {
		return fmt.Errorf("cluster: start %s: already running as pid %d", p.what(), p.cur.pid)
	}
	logf, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("cluster: start %s: %w", p.what(), err)
	}
	defer logf.Close() // the child has its own descriptor once started
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("cluster: start %s: %w", p.what(), err)
	}
	fmt.Fprintf(logf, "=== cluster: %s starting %s on %s\n", time.Now().Format(time.RFC3339Nano), p.what(), p.addr)

	var cmd *exec.Cmd
	if p.ctr != nil {
		p.ctr.remove()
		args, err := p.ctr.runArgs(p.path, p.argv(p.addr), p.env)
		if err != nil {
			return fmt.Errorf("cluster: start %s: %w", p.what(), err)
		}
		cmd = exec.Command(p.ctr.d.cli, args...)
	} else {
		cmd = exec.Command(p.path, p.argv(p.addr)...)
		cmd.Env = p.env
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r := &run{cmd: cmd, logStart: logStart, done: make(chan struct{})}
	if err := startLocked(r); err != nil {
		return fmt.Errorf("cluster: start %s: %w", p.what(), err)
	}
	p.cur = r
	p.log.Debug("cluster: process started", "process", p.Name(), "pid", r.pid, "addr", p.addr)
	return nil
}

// startLocked starts r.cmd from a goroutine locked to its OS thread, which
// stays alive until the child has been reaped. Pdeathsig is delivered when
// the thread that forked the child exits, and Go ends a thread when a
// goroutine exits while locked to it; keeping the thread locked to this
// goroutine means only the death of this process kills the child. On
// success r.pid is set and r.done is closed once the child is reaped.
func startLocked(r *run) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := r.cmd.Start(); err != nil {
			started <- err
			return
		}
		r.pid = r.cmd.Process.Pid
		started <- nil
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	return <-started
}

// logTail returns the end of what run r wrote to the log.
func (p *Process) logTail(r *run) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	from := max(r.logStart, fi.Size()-logTailBytes)
	b := make([]byte, max(fi.Size()-from, 0))
	n, _ := f.ReadAt(b, from)
	return fmt.Sprintf("%s log %s (tail):\n%s", p.kind, p.logPath, bytes.TrimSpace(b[:n]))
}

// freeAddr returns 127.0.0.1:PORT for a port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cluster: pick a free port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("cluster: pick a free port: %w", err)
	}
	return addr, nil
}

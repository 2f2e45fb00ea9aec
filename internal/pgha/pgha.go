package pgha

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem/internal/freeport"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/procfs"
)

// ErrNotInstalled is returned, wrapped, by Start when the patroni program
// cannot be found.
var ErrNotInstalled = errors.New(`pgha: patroni not found; install the Debian package "patroni" (apt-get install patroni)`)

// Defaults of Options.
const (
	DefaultScope     = "idem-store"
	DefaultNamespace = "/idem-pgha/"
	// DefaultTTL is the leader key's TTL: how long after losing etcd a
	// primary keeps its role, and the least time a failover takes.
	DefaultTTL = 10 * time.Second
	// DefaultLoopWait is how often each agent runs its HA loop.
	DefaultLoopWait = time.Second
	// DefaultRetryTimeout bounds the agents' etcd and PostgreSQL retries.
	DefaultRetryTimeout = 4 * time.Second
	// DefaultStartTimeout bounds how long Start waits for the members to
	// become healthy.
	DefaultStartTimeout = 2 * time.Minute
	// Superuser is the PostgreSQL superuser URL and Cluster.URL use.
	Superuser = "postgres"
	// replicator is the replication role.
	replicator = "replicator"
)

const (
	stopTimeout  = 30 * time.Second
	pollInterval = 100 * time.Millisecond
	apiTimeout   = 2 * time.Second
)

// MemberSpec names one member.
type MemberSpec struct {
	// Name is the member's Patroni name (unique; letters, digits, "-").
	Name string
	// Region is informative: the region the member stands for.
	Region string
	// EtcdHosts, if set, are the etcd client endpoints (host:port) this
	// member's agent uses instead of Options.EtcdHosts, for example
	// proxies that can be cut. Default: Options.EtcdHosts.
	EtcdHosts []string
}

// Options configure Start. Members and EtcdHosts are required.
type Options struct {
	// Dir holds one directory per member (Dir/<name>: patroni.yml, data/,
	// patroni.log). When running as root the "postgres" OS user must be
	// able to reach it (see pgserver.DirFor). Default: a new temporary
	// directory, removed by Stop.
	Dir string
	// Members are the members, at least two. Start bootstraps the cluster
	// from whichever member wins the race for the initialize key.
	Members []MemberSpec
	// EtcdHosts are the etcd client endpoints (host:port; HTTPS with
	// TLS, plain HTTP without).
	EtcdHosts []string
	// TLS, if set, returns the PEM files of the member with the given
	// name, and turns TLS on for every link of the store: each agent
	// verifies etcd and authenticates to it with its certificate, each
	// PostgreSQL server accepts TCP connections (clients, replicas,
	// pg_rewind) only over TLS, and replicas verify the server they
	// stream from. URL and Member.URL then verify the servers
	// (sslmode=verify-full). Each agent's REST API serves HTTPS with the
	// member's certificate and requires a client certificate of the CA
	// (the agents present theirs to each other; this package presents
	// APIClientTLS's). Start copies the files into the member's
	// directory, owned by PostgreSQL's OS user. Default: no TLS.
	TLS func(member string) (TLSFiles, error)
	// APIClientTLS is how this package calls the agents' REST API with
	// TLS: it must trust the CA and present a client certificate the
	// agents accept. Required with TLS.
	APIClientTLS *tls.Config
	// Scope is Patroni's cluster name. Default DefaultScope.
	Scope string
	// Namespace is the etcd key prefix. Default DefaultNamespace.
	Namespace string
	// TTL, LoopWait and RetryTimeout are Patroni's ttl, loop_wait and
	// retry_timeout (whole seconds; LoopWait + 2*RetryTimeout <= TTL).
	// Defaults DefaultTTL, DefaultLoopWait, DefaultRetryTimeout.
	TTL, LoopWait, RetryTimeout time.Duration
	// StartTimeout bounds how long Start waits for every member to run,
	// a leader and a synchronous standby: a member that never comes up
	// (its port taken by another process since it was picked, say) fails
	// the start instead of holding it forever. Default
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Database, if set, is created once the cluster is up.
	Database string
	// Advertise, if set, returns the addresses (host:port) the member
	// with the given name advertises to the other members for its
	// PostgreSQL server (port: replication) and its REST API (apiPort),
	// for example proxies in front of them; called before the member
	// starts. Default: 127.0.0.1:port and 127.0.0.1:apiPort.
	Advertise func(name string, port, apiPort int) (pg, api string, err error)
	// PatroniPath is the patroni program. Default: "patroni" on PATH.
	PatroniPath string
	// BinDir holds PostgreSQL's binaries. Default pgserver.FindBinDir().
	BinDir string
	// Logger receives progress messages. Default: discard.
	Logger *slog.Logger
}

// TLSFiles are one member's PEM files.
type TLSFiles struct {
	// CAFile verifies every member's server and etcd's.
	CAFile string
	// CertFile and KeyFile are the member's certificate and key: its
	// PostgreSQL server's (valid for the address it advertises) and its
	// agent's client certificate towards etcd.
	CertFile, KeyFile string
}

// Cluster is a running store started by Start. Its methods are safe for
// concurrent use. The caller must call Stop.
type Cluster struct {
	log       *slog.Logger
	dir       string
	removeDir bool
	password  string // the superuser's
	caFile    string // "" without Options.TLS
	members   []*Member
	http      *httpClient

	stopOnce sync.Once
	stopErr  error
}

// Member is one Patroni agent and its PostgreSQL server.
type Member struct {
	// Name and Region are the MemberSpec's.
	Name, Region string
	// Port is PostgreSQL's port and APIPort Patroni's REST API port, both
	// on 127.0.0.1.
	Port, APIPort int

	c       *Cluster
	dir     string
	patroni string
	cred    *syscall.Credential

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start writes every member's configuration, starts the agents and returns
// once there is a leader, every member runs and one of them is the
// synchronous standby (so the store accepts commits), and Options.Database
// exists. ctx bounds startup; on failure Start stops what it started.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if len(opts.Members) < 2 || len(opts.EtcdHosts) == 0 {
		return nil, errors.New("pgha: Options.Members (at least two) and Options.EtcdHosts are required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	patroni := opts.PatroniPath
	if patroni == "" {
		p, err := exec.LookPath("patroni")
		if err != nil {
			return nil, fmt.Errorf("pgha: %w", ErrNotInstalled)
		}
		patroni = p
	}
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = pgserver.FindBinDir(); err != nil {
			return nil, fmt.Errorf("pgha: %w", err)
		}
	}
	setDuration(&opts.TTL, DefaultTTL)
	setDuration(&opts.LoopWait, DefaultLoopWait)
	setDuration(&opts.RetryTimeout, DefaultRetryTimeout)
	setDuration(&opts.StartTimeout, DefaultStartTimeout)
	if opts.LoopWait+2*opts.RetryTimeout > opts.TTL {
		return nil, fmt.Errorf("pgha: LoopWait (%v) + 2*RetryTimeout (%v) must not exceed TTL (%v)", opts.LoopWait, opts.RetryTimeout, opts.TTL)
	}
	if opts.Scope == "" {
		opts.Scope = DefaultScope
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	cred, err := pgserver.Credential()
	if err != nil {
		return nil, fmt.Errorf("pgha: %w", err)
	}

	if opts.TLS != nil && opts.APIClientTLS == nil {
		return nil, errors.New("pgha: Options.APIClientTLS is required with Options.TLS")
	}
	c := &Cluster{log: log, http: newHTTPClient(opts.APIClientTLS)}
	ok := false
	defer func() {
		if !ok {
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			_ = c.Stop(sctx)
		}
	}()
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "pgha-")
		if err != nil {
			return nil, fmt.Errorf("pgha: %w", err)
		}
		c.dir, c.removeDir = d, true
		if err := pgserver.Chown(d, cred); err != nil {
			return nil, err
		}
	} else {
		d, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, fmt.Errorf("pgha: %w", err)
		}
		c.dir = d
		if err := pgserver.MkdirAllOwned(d, cred); err != nil {
			return nil, err
		}
	}
	if c.password, err = secret(); err != nil {
		return nil, err
	}
	replPassword, err := secret()
	if err != nil {
		return nil, err
	}

	// Every member's two ports, picked together: picked one at a time,
	// two members were once given the same port.
	ports, err := freeport.Distinct(2 * len(opts.Members))
	if err != nil {
		return nil, fmt.Errorf("pgha: %w", err)
	}
	for i, spec := range opts.Members {
		m := &Member{Name: spec.Name, Region: spec.Region, c: c, dir: filepath.Join(c.dir, spec.Name), patroni: patroni, cred: cred}
		// A member's directory is new at every Start: etcd starts afresh
		// too, and Patroni would not bootstrap over an old data directory.
		if err := os.RemoveAll(m.dir); err != nil {
			return nil, fmt.Errorf("pgha: %w", err)
		}
		if err := pgserver.MkdirAllOwned(m.dir, cred); err != nil {
			return nil, err
		}
		m.Port, m.APIPort = ports[2*i], ports[2*i+1]
		advertise := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port))
		apiAdvertise := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.APIPort))
		if opts.Advertise != nil {
			if advertise, apiAdvertise, err = opts.Advertise(m.Name, m.Port, m.APIPort); err != nil {
				return nil, err
			}
		}
		hosts := opts.EtcdHosts
		if len(spec.EtcdHosts) > 0 {
			hosts = spec.EtcdHosts
		}
		var tlsFiles *TLSFiles
		if opts.TLS != nil {
			if tlsFiles, err = m.copyTLS(opts.TLS); err != nil {
				return nil, err
			}
			if c.caFile == "" {
				c.caFile = tlsFiles.CAFile
			}
		}
		cfg := memberConfig{
			TLS:   tlsFiles,
			Scope: opts.Scope, Namespace: opts.Namespace, Name: m.Name,
			APIPort: m.APIPort, Port: m.Port, Advertise: advertise, APIAdvertise: apiAdvertise, EtcdHosts: hosts,
			Dir: m.dir, BinDir: binDir, Password: c.password, ReplPassword: replPassword,
			TTL: seconds(opts.TTL), LoopWait: seconds(opts.LoopWait), RetryTimeout: seconds(opts.RetryTimeout),
			SyncStandbys: len(opts.Members) - 1,
		}
		if err := writeConfig(m.configPath(), cfg.yaml(), cred); err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		if err := m.Start(); err != nil {
			return nil, err
		}
	}
	if err := c.waitStarted(ctx, opts.StartTimeout); err != nil {
		return nil, err
	}
	if opts.Database != "" {
		if err := c.createDatabase(ctx, opts.Database); err != nil {
			return nil, err
		}
	}
	ok = true
	log.Info("pgha: store ready", "members", len(c.members), "dir", c.dir)
	return c, nil
}

// waitStarted is WaitHealthy for at most timeout, failing at once, with
// the end of its log, when an agent exits meanwhile (a broken
// installation, say patroni without the python3-etcd module it needs for
// etcd3).
func (c *Cluster) waitStarted(ctx context.Context, timeout time.Duration) error {
	ctx, stop := context.WithTimeout(ctx, timeout)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	for _, m := range c.members {
		m.mu.Lock()
		exited := m.exited
		m.mu.Unlock()
		go func() {
			select {
			case <-exited:
				cancel(fmt.Errorf("pgha: the agent of %s exited during startup:\n%s", m.Name, logTail(m.LogPath())))
			case <-ctx.Done():
			}
		}()
	}
	err := c.WaitHealthy(ctx)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return err
}

// logTail returns the end of the file at path.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const tail = 2048
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return strings.TrimSpace(string(b))
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

func seconds(d time.Duration) int { return max(1, int(d.Round(time.Second)/time.Second)) }

// secret returns 32 random hex digits.
func secret() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("pgha: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// writeConfig writes a member's configuration, mode 0600, owned by cred.
func writeConfig(path string, body []byte, cred *syscall.Credential) error {
	if err := os.WriteFile(path, body, 0o600); err != nil {
		return fmt.Errorf("pgha: %w", err)
	}
	return pgserver.Chown(path, cred)
}

// Dir returns the directory holding the members' directories.
func (c *Cluster) Dir() string { return c.dir }

// Members returns the members in Options order.
func (c *Cluster) Members() []*Member { return c.members }

// Member returns the member called name, or nil.
func (c *Cluster) Member(name string) *Member {
	for _, m := range c.members {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// Password returns the superuser's password (also in URL and in the
// members' configuration files).
func (c *Cluster) Password() string { return c.password }

// URL returns the multi-host URL of database db as the superuser: every
// member, in order, with target_session_attrs=read-write, so that a
// connection reaches the current primary.
func (c *Cluster) URL(db string) string {
	hosts := make([]string, len(c.members))
	for i, m := range c.members {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port))
	}
	q := c.sslParams()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	return c.urlFor(strings.Join(hosts, ","), db, q)
}

// sslParams are the URL parameters of a connection to a member: TLS
// verifying the server with Options.TLS, none without.
func (c *Cluster) sslParams() url.Values {
	if c.caFile == "" {
		return url.Values{"sslmode": {"disable"}}
	}
	return url.Values{"sslmode": {"verify-full"}, "sslrootcert": {c.caFile}}
}

// CAFile returns the CA file that verifies the members' servers (a copy
// of Options.TLS's), or "" without TLS.
func (c *Cluster) CAFile() string { return c.caFile }

func (c *Cluster) urlFor(hosts, db string, q url.Values) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(Superuser, c.password), Host: hosts, Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// URL returns the URL of database db on this member alone, without a
// password (see Cluster.Password).
func (m *Member) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(Superuser), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)), Path: "/" + db, RawQuery: m.c.sslParams().Encode()}
	return u.String()
}

// copyTLS copies the member's TLS files from tlsFor into its directory
// (tls/), owned by PostgreSQL's OS user, the key with mode 0600 as
// PostgreSQL requires, and returns the copies.
func (m *Member) copyTLS(tlsFor func(string) (TLSFiles, error)) (*TLSFiles, error) {
	src, err := tlsFor(m.Name)
	if err != nil {
		return nil, fmt.Errorf("pgha: TLS files of %s: %w", m.Name, err)
	}
	dir := filepath.Join(m.dir, "tls")
	if err := pgserver.MkdirAllOwned(dir, m.cred); err != nil {
		return nil, err
	}
	out := &TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem")}
	for _, f := range []struct {
		from, to string
		mode     os.FileMode
	}{{src.CAFile, out.CAFile, 0o644}, {src.CertFile, out.CertFile, 0o644}, {src.KeyFile, out.KeyFile, 0o600}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return nil, fmt.Errorf("pgha: TLS files of %s: %w", m.Name, err)
		}
		if err := os.WriteFile(f.to, b, f.mode); err != nil {
			return nil, fmt.Errorf("pgha: TLS files of %s: %w", m.Name, err)
		}
		if err := pgserver.Chown(f.to, m.cred); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// APIURL returns the base URL of the member's Patroni REST API.
func (m *Member) APIURL() string {
	scheme := "http"
	if m.c.caFile != "" {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.APIPort))
}

// Dir returns the member's directory (patroni.yml, data/, patroni.log).
func (m *Member) Dir() string { return m.dir }

func (m *Member) configPath() string { return filepath.Join(m.dir, "patroni.yml") }

// LogPath returns the file receiving Patroni's (and PostgreSQL's) output.
func (m *Member) LogPath() string { return filepath.Join(m.dir, "patroni.log") }

// createDatabase creates db on the primary; one that exists is kept.
func (c *Cluster) createDatabase(ctx context.Context, db string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgha: connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") {
		return fmt.Errorf("pgha: create database %s: %w", db, err)
	}
	// A client trying the members in order gives up at a member that lacks
	// the database (SQLSTATE 3D000 ends pgx's walk over the hosts), so wait
	// until every replica has replayed its creation.
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for _, m := range c.members {
		u := c.urlFor(net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)), db, c.sslParams())
		for {
			conn, err := pgx.Connect(ctx, u)
			if err == nil {
				_ = conn.Close(ctx)
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("pgha: database %s on %s: %w (last error: %v)\n%s", db, m.Name, ctx.Err(), err, c.diagnose(m))
			case <-t.C:
			}
		}
	}
	return nil
}

// diagnose describes the cluster as its agents see it and the end of
// m's log, for an error that gave up waiting on m.
func (c *Cluster) diagnose(m *Member) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*apiTimeout)
	defer cancel()
	st, err := c.Status(ctx)
	return fmt.Sprintf("cluster status: %+v (error: %v)\nlog of %s:\n%s", st, err, m.Name, logTail(m.LogPath()))
}

// Start starts the member's agent, which starts (or, after Kill, restarts
// and rejoins) its PostgreSQL server; it does not wait for it. Starting a
// running member is an error.
func (m *Member) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exited != nil {
		select {
		case <-m.exited:
		default:
			return fmt.Errorf("pgha: member %s is running", m.Name)
		}
	}
	logf, err := os.OpenFile(m.LogPath(), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("pgha: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(m.patroni, m.configPath())
	cmd.Dir = m.dir
	cmd.Env = agentEnv(m.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGTERM if the starting thread dies: Patroni then stops its server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: m.cred, Pdeathsig: syscall.SIGTERM}
	exited := make(chan struct{})
	if err := pgserver.StartLocked(cmd, func(error) {}, exited); err != nil {
		return fmt.Errorf("pgha: start patroni for %s: %w", m.Name, err)
	}
	m.cmd, m.exited = cmd, exited
	m.c.log.Info("pgha: member started", "member", m.Name, "pid", cmd.Process.Pid, "port", m.Port, "api_port", m.APIPort)
	return nil
}

// agentEnv is this process's environment without PG* and PATRONI_*
// variables, which would change what Patroni and PostgreSQL do, and with
// HOME set to the member's directory: libpq (pg_basebackup, the replicas'
// connections) reads ~/.postgresql and ~/.pgpass, which must be the
// member's own, not those of whoever started it (unreadable to
// PostgreSQL's OS user when that is root).
func agentEnv(home string) []string {
	env := []string{"HOME=" + home}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "PATRONI_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return env
}

// Running reports whether the member's agent runs.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exited == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// Pid returns the agent's process id, or 0 if it does not run.
func (m *Member) Pid() int {
	if !m.Running() {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// PostmasterPid returns the process id in the member's postmaster.pid, or
// 0 if there is none (the server does not run).
func (m *Member) PostmasterPid() int {
	b, err := os.ReadFile(filepath.Join(m.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	if syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// Kill ends the member at once, as the loss of its machine would: SIGKILL
// for the agent, then for the postmaster and every process it forked. It
// returns once the agent has been reaped and the postmaster is gone.
func (m *Member) Kill(ctx context.Context) error {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
	return m.killPostmaster(ctx)
}

// killPostmaster kills the server Patroni started, which runs in a session
// of its own and so outlives the agent.
func (m *Member) killPostmaster(ctx context.Context) error {
	pid := m.PostmasterPid()
	if pid == 0 {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new children while they are collected
	for _, child := range procfs.Children(pid) {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t := time.NewTicker(pollInterval / 5)
	defer t.Stop()
	for syscall.Kill(pid, 0) == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgha: postmaster %d of %s: %w", pid, m.Name, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Stop stops the member: SIGTERM to its agent, which stops its server; if
// that has not finished when ctx ends or after stopTimeout, Kill.
func (m *Member) Stop(ctx context.Context) error {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return m.killPostmaster(ctx)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	var err error
	select {
	case <-exited:
	case <-ctx.Done():
		err = fmt.Errorf("pgha: stop %s: %w", m.Name, ctx.Err())
	case <-t.C:
		err = fmt.Errorf("pgha: stop %s: agent still running after %v, killed", m.Name, stopTimeout)
	}
	kctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	return errors.Join(err, m.Kill(kctx))
}

// Stop stops every member, replicas first, and removes the directory if
// Start created it. It is idempotent.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { c.stopErr = c.stop(ctx) })
	return c.stopErr
}

func (c *Cluster) stop(ctx context.Context) error {
	var errs []error
	lctx, cancel := context.WithTimeout(ctx, apiTimeout)
	leader, _ := c.Leader(lctx)
	cancel()
	var wg sync.WaitGroup
	perr := make([]error, len(c.members))
	for i, m := range c.members {
		if m != leader {
			wg.Go(func() { perr[i] = m.Stop(ctx) })
		}
	}
	wg.Wait()
	errs = append(errs, perr...)
	if leader != nil {
		errs = append(errs, leader.Stop(ctx))
	}
	if c.removeDir && c.dir != "" {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgha: %w", err))
		}
	}
	return errors.Join(errs...)
}

// URLWithPassword returns the URL of database db on this member alone, as
// the superuser with its password, without target_session_attrs: a client
// that keeps talking to this member whatever its role.
func (m *Member) URLWithPassword(db string) string {
	return m.c.urlFor(net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)), db, url.Values{"sslmode": {"disable"}, "connect_timeout": {"2"}})
}

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/procfs"
)

// ErrNotInstalled is returned, wrapped, by Start and FindBinDir when the
// PostgreSQL server binaries (initdb, postgres) cannot be found.
var ErrNotInstalled = errors.New(`pgserver: PostgreSQL server binaries (initdb, postgres) not found; install the Debian package "postgresql" (apt-get install postgresql)`)

const (
	// superuser is the bootstrap superuser created by initdb; it
	// authenticates with trust, so URLs carry no password.
	superuser = "postgres"
	// osUser runs the server processes when the caller is root.
	osUser = "postgres"
	// maxSocketPath is the usable length of sockaddr_un.sun_path on Linux
	// (108 bytes including the terminating NUL).
	maxSocketPath = 107
	// portAttempts bounds startup retries when a picked port is taken.
	portAttempts = 5
	// stopTimeout bounds a fast shutdown before Stop escalates.
	stopTimeout = 60 * time.Second
	// quitGrace bounds an immediate shutdown (SIGQUIT) before SIGKILL.
	quitGrace = 5 * time.Second
	// pollInterval is the delay between readiness probes.
	pollInterval = 20 * time.Millisecond
	// logTailBytes is how much of the server log errors quote.
	logTailBytes = 2048
)

// Options configure Start. Every field has a documented default; the zero
// Options starts a fast, throwaway server in a new temporary directory.
type Options struct {
	// Dir holds the cluster (Dir/data), the server log (Dir/postgres.log)
	// and, when the path is short enough, the Unix socket (in Dir/data).
	// If Dir/data already holds a cluster it is reused, which suits a
	// local development cluster; otherwise initdb creates one. A Dir given
	// here is never removed.
	// Default: a new directory from os.MkdirTemp, removed by Stop.
	Dir string

	// Port is the TCP port the server listens on at 127.0.0.1.
	// Default 0: pick a free port, retrying with another one a few
	// times if it is taken before the server binds it.
	Port int

	// BinDir is the directory holding initdb and postgres.
	// Default: the result of FindBinDir.
	BinDir string

	// Logger receives progress messages (initdb, start, stop).
	// Default: discard.
	Logger *slog.Logger

	// Fsync keeps PostgreSQL's durable defaults. Default false: the
	// server runs with fsync, synchronous_commit and full_page_writes
	// off and initdb runs with --no-sync, which is much faster but loses
	// data on an OS crash. Benchmarks set it to true.
	Fsync bool

	// Settings are extra server settings, passed as -c name=value after
	// the defaults, so they override them (for example max_connections).
	// The port is always Options.Port; a "port" key is rejected. Readiness
	// is probed over the Unix socket and URL uses 127.0.0.1, so an
	// overridden listen_addresses should still include 127.0.0.1.
	// Default: none.
	Settings map[string]string

	// TLS turns ssl on, with a server certificate for 127.0.0.1, ::1 and
	// localhost signed by a throwaway certificate authority made at start
	// (Dir/tls; the key is owned by the server's OS user with mode 0600).
	// Clients verify it with Server.CAFile, as TLSURLFor does; plain
	// connections are still accepted. Default false: no TLS.
	TLS bool
}

// Server is a running PostgreSQL server started by Start. Its methods are
// safe for concurrent use. The caller must call Stop.
type Server struct {
	log         *slog.Logger
	dir         string // Options.Dir or the temporary directory
	removeDir   bool   // dir was created by Start
	dataDir     string
	logPath     string
	sockDir     string
	removeSock  bool   // sockDir is a temporary directory of its own
	tlsDir      string // "" without Options.TLS
	port        int
	cmd         *exec.Cmd
	exited      chan struct{} // closed when the postmaster has been reaped
	stopOnce    sync.Once
	stopErr     error
	startedTime time.Time
}

// FindBinDir returns a directory holding the initdb and postgres binaries:
// the directory of initdb found on PATH (after resolving symlinks) if
// postgres is next to it, otherwise
// the highest-versioned /usr/lib/postgresql/*/bin (the Debian layout). The
// error wraps ErrNotInstalled when there is none.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// Resolve symlinks such as /usr/local/bin/initdb ->
		// /usr/lib/postgresql/15/bin/initdb to the installation itself.
		if p, err := filepath.EvalSymlinks(p); err == nil {
			if p, err := filepath.Abs(p); err == nil && hasServerBinaries(filepath.Dir(p)) {
				return filepath.Dir(p), nil
			}
		}
	}
	const debianGlob = "/usr/lib/postgresql/*/bin"
	dirs, _ := filepath.Glob(debianGlob) // the pattern is valid
	// Highest major version first: "15" > "9.6" numerically, not lexically.
	sort.Slice(dirs, func(i, j int) bool {
		return versionOf(dirs[i]) > versionOf(dirs[j])
	})
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgserver: looked for initdb on PATH and in %s: %w", debianGlob, ErrNotInstalled)
}

// versionOf parses the N in /usr/lib/postgresql/N/bin; unparsable is 0.
func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Start initializes a cluster if needed and starts a server, returning once
// it accepts connections. ctx bounds startup only (initdb, start, readiness
// wait); if it ends first, Start stops the server, removes what it created
// and returns an error wrapping ctx.Err(). The returned Server runs until
// Stop. On failure the error quotes the tail of the server log.
func Start(ctx context.Context, opts Options) (*Server, error) {
	started := time.Now()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if _, ok := opts.Settings["port"]; ok {
		return nil, errors.New(`pgserver: Settings must not contain "port"; use Options.Port`)
	}
	for name := range opts.Settings {
		if name == "" || strings.ContainsAny(name, "= \t\n") {
			return nil, fmt.Errorf("pgserver: invalid setting name %q", name)
		}
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("pgserver: invalid port %d", opts.Port)
	}

	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasServerBinaries(binDir) {
		return nil, fmt.Errorf("pgserver: no initdb and postgres in BinDir %s: %w", binDir, ErrNotInstalled)
	}

	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}

	s := &Server{log: log, exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.removeDirs()
		}
	}()
	if err := s.prepareDirs(opts.Dir, cred); err != nil {
		return nil, err
	}

	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err == nil {
		log.Info("pgserver: reusing existing cluster", "data", s.dataDir)
	} else {
		if err := s.initdb(ctx, binDir, cred, opts.Fsync); err != nil {
			return nil, err
		}
	}

	if opts.TLS {
		s.tlsDir = filepath.Join(s.dir, "tls")
		if err := writeTLS(s.tlsDir, cred); err != nil {
			return nil, err
		}
	}

	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		err = s.startPostgres(ctx, binDir, cred, port, opts)
		if err == nil {
			break
		}
		if opts.Port == 0 && attempt < portAttempts && errors.Is(err, errPortInUse) && ctx.Err() == nil {
			log.Info("pgserver: port taken, retrying", "port", port, "attempt", attempt)
			s.exited = make(chan struct{})
			continue
		}
		return nil, err
	}
	ok = true
	s.startedTime = time.Now()
	log.Info("pgserver: started", "pid", s.Pid(), "port", s.port, "dir", s.dir,
		"elapsed", time.Since(started).Round(time.Millisecond))
	return s, nil
}

// serverCredential returns nil when the server can run as the current user,
// and the postgres OS user's credential when running as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root needs the %q OS user (created by the Debian package \"postgresql\"): %w", osUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: uid of %q: %w", osUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: gid of %q: %w", osUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDirs creates the directory layout and records it in s.
func (s *Server) prepareDirs(dir string, cred *syscall.Credential) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "pgserver-")
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		s.dir, s.removeDir = d, true
		if err := chown(d, cred); err != nil {
			return err
		}
	} else {
		d, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		s.dir = d
		if err := mkdirAllOwned(d, cred); err != nil {
			return err
		}
	}
	if err := checkReachable(s.dir, cred); err != nil {
		return err
	}

	s.dataDir = filepath.Join(s.dir, "data")
	s.logPath = filepath.Join(s.dir, "postgres.log")
	if err := os.Mkdir(s.dataDir, 0o700); err == nil {
		if err := chown(s.dataDir, cred); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("pgserver: %w", err)
	}

	// The socket is dataDir/.s.PGSQL.NNNNN; sun_path is tiny.
	s.sockDir = s.dataDir
	if len(filepath.Join(s.sockDir, ".s.PGSQL.65535.lock")) > maxSocketPath {
		d, err := os.MkdirTemp("/tmp", "pgs")
		if err != nil {
			return fmt.Errorf("pgserver: socket directory: %w", err)
		}
		s.sockDir, s.removeSock = d, true
		if err := chown(d, cred); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAllOwned is os.MkdirAll(dir, 0o700), giving the directories it
// creates (only those) to cred.
func mkdirAllOwned(dir string, cred *syscall.Credential) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgserver: %w", err)
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	for _, d := range missing {
		if err := chown(d, cred); err != nil {
			return err
		}
	}
	return nil
}

func chown(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// checkReachable reports, when the server runs as another user, a parent
// of dir that user cannot search, so the failure is explained up front
// rather than by a "Permission denied" deep inside initdb's output.
func checkReachable(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			perm := fi.Mode().Perm()
			var can bool
			switch {
			case st.Uid == cred.Uid:
				can = perm&0o100 != 0
			case st.Gid == cred.Gid:
				can = perm&0o010 != 0
			default:
				can = perm&0o001 != 0
			}
			if !can {
				return fmt.Errorf("pgserver: the server runs as OS user %q (uid %d), which cannot search %s (mode %v, uid %d); use a directory under %s or leave Options.Dir empty",
					osUser, cred.Uid, d, perm, st.Uid, os.TempDir())
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// serverEnv is the caller's environment without PG* variables, which would
// otherwise change what initdb and postgres do (PGDATA, PGPORT, ...).
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// sysProcAttr puts the child in its own process group, runs it as cred,
// and has the kernel send it SIGQUIT (PostgreSQL's immediate shutdown) if
// the thread that started it dies.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:    true,
		Credential: cred,
		Pdeathsig:  syscall.SIGQUIT,
	}
}

// StartLocked starts cmd from a goroutine locked to its OS thread and keeps
// that thread until cmd has been reaped. Pdeathsig fires when the thread
// that forked the child exits, and Go ends a thread when a goroutine exits
// while locked to it; a thread locked to us cannot be handed to such a
// goroutine, so only the death of this process kills the child. wait is
// called with cmd.Wait's result, then done is closed.
func StartLocked(cmd *exec.Cmd, wait func(error), done chan<- struct{}) error {
	started := make(chan error, 1)
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		wait(cmd.Wait())
	}()
	return <-started
}

func (s *Server) initdb(ctx context.Context, binDir string, cred *syscall.Credential, fsync bool) error {
	s.log.Info("pgserver: initdb", "data", s.dataDir)
	logf, err := s.openLog()
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"-D", s.dataDir, "-U", superuser, "--auth=trust", "-E", "UTF8", "--no-locale"}
	if !fsync {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
	cmd.Dir = s.dir
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr(cred)
	// Kill initdb's whole group: it runs postgres in bootstrap mode.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var waitErr error
	done := make(chan struct{})
	if err := StartLocked(cmd, func(err error) { waitErr = err }, done); err != nil {
		return fmt.Errorf("pgserver: initdb: %w", err)
	}
	<-done
	if waitErr != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pgserver: initdb: %w", ctx.Err())
		}
		return fmt.Errorf("pgserver: initdb: %w\n%s", waitErr, s.logTail(0))
	}
	return nil
}

// openLog opens the server log for appending; the caller closes it once
// the child has it.
func (s *Server) openLog() (*os.File, error) {
	f, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	return f, nil
}

// errPortInUse marks a start attempt that failed because the port was taken.
var errPortInUse = errors.New("port in use")

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: pick a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgserver: pick a free port: %w", err)
	}
	return port, nil
}

// startPostgres runs postgres on port and waits until it accepts
// connections. On failure no server process is left running.
func (s *Server) startPostgres(ctx context.Context, binDir string, cred *syscall.Credential, port int, opts Options) error {
	args := []string{
		"-D", s.dataDir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.sockDir,
		"-c", "max_connections=200",
	}
	if !opts.Fsync {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	if s.tlsDir != "" {
		args = append(args, "-c", "ssl=on",
			"-c", "ssl_cert_file="+filepath.Join(s.tlsDir, "server.pem"),
			"-c", "ssl_key_file="+filepath.Join(s.tlsDir, "server-key.pem"))
	}
	names := make([]string, 0, len(opts.Settings))
	for name := range opts.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		args = append(args, "-c", name+"="+opts.Settings[name])
	}

	logf, err := s.openLog()
	if err != nil {
		return err
	}
	defer logf.Close()
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}

	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr(cred)
	var waitErr error
	if err := StartLocked(cmd, func(err error) { waitErr = err }, s.exited); err != nil {
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	s.cmd, s.port = cmd, port
	s.log.Debug("pgserver: postgres forked", "pid", cmd.Process.Pid, "port", port)

	// Probe over the Unix socket: it is private to this server, so a
	// success cannot come from another server that owns the TCP port, and
	// postgres exits if it cannot bind its TCP address.
	q := url.Values{
		"host":            {s.sockDir},
		"port":            {strconv.Itoa(port)},
		"sslmode":         {"disable"},
		"connect_timeout": {"2"},
	}
	probe, err := pgx.ParseConfig((&url.URL{
		Scheme: "postgres", User: url.User(superuser), Path: "/postgres", RawQuery: q.Encode(),
	}).String())
	if err != nil {
		s.terminate()
		return fmt.Errorf("pgserver: %w", err)
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		conn, err := pgx.ConnectConfig(ctx, probe)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		select {
		case <-s.exited:
			tail := s.logTail(logStart)
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("pgserver: postgres on port %d: %w\n%s", port, errPortInUse, tail)
			}
			return fmt.Errorf("pgserver: postgres exited during startup (%v)\n%s", waitErr, tail)
		case <-ctx.Done():
			s.terminate()
			return fmt.Errorf("pgserver: waiting for postgres to accept connections: %w (last attempt: %v)\n%s", ctx.Err(), err, s.logTail(logStart))
		case <-tick.C:
		}
	}
}

// logTail returns the end of the server log written after offset from.
func (s *Server) logTail(from int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(server log: %v)", err)
	}
	from = max(from, fi.Size()-logTailBytes)
	b := make([]byte, max(fi.Size()-from, 0))
	n, _ := f.ReadAt(b, from)
	return fmt.Sprintf("server log %s (tail):\n%s", s.logPath, bytes.TrimSpace(b[:n]))
}

// URL returns the URL of the postgres database as the trusted superuser
// postgres over TCP, e.g.
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
func (s *Server) URL() string { return s.URLFor("postgres") }

// URLFor returns the URL of database db, like URL.
func (s *Server) URLFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CAFile returns the certificate (PEM) of the authority that signed the
// server's certificate, or "" without Options.TLS.
func (s *Server) CAFile() string {
	if s.tlsDir == "" {
		return ""
	}
	return filepath.Join(s.tlsDir, "ca.pem")
}

// TLSURLFor returns the URL of database db over TLS, verifying the server's
// certificate and name against CAFile:
// postgres://postgres@127.0.0.1:PORT/db?sslmode=verify-full&sslrootcert=CA.
// Without Options.TLS it returns URLFor(db).
func (s *Server) TLSURLFor(db string) string {
	if s.tlsDir == "" {
		return s.URLFor(db)
	}
	u, _ := url.Parse(s.URLFor(db)) // URLFor's URL parses
	u.RawQuery = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {s.CAFile()}}.Encode()
	return u.String()
}

// Port returns the TCP port the server listens on at 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Pid returns the process id of the postmaster.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// CreateDatabase creates an empty database called name (any string; it is
// quoted as an identifier) and returns its URL. It connects and
// disconnects for the call.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return "", fmt.Errorf("pgserver: create database %q: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgserver: create database %q: %w", name, err)
	}
	return s.URLFor(name), nil
}

// Stop shuts the server down and waits until every server process has
// exited, then removes Dir if Start created it. It asks for a fast shutdown
// (as pg_ctl stop -m fast does: open sessions are terminated); if that has
// not finished when ctx ends or after a minute, it escalates to an immediate
// shutdown and then SIGKILL, and the error wraps ctx.Err(). Stop is
// idempotent: later calls wait for the first and return its result.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() { s.stopErr = s.stop(ctx) })
	return s.stopErr
}

func (s *Server) stop(ctx context.Context) error {
	var errs []error
	_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown; fails only if already exited
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.exited:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("pgserver: fast shutdown interrupted, killed: %w", ctx.Err()))
		s.terminate()
	case <-timer.C:
		errs = append(errs, fmt.Errorf("pgserver: fast shutdown took over %v, killed", stopTimeout))
		s.terminate()
	}
	if err := s.removeDirs(); err != nil {
		errs = append(errs, err)
	}
	s.log.Info("pgserver: stopped", "pid", s.Pid(), "port", s.port,
		"uptime", time.Since(s.startedTime).Round(time.Millisecond))
	return errors.Join(errs...)
}

// terminate ends the server without a checkpoint and returns once the
// postmaster has been reaped: SIGQUIT (immediate shutdown, which also
// stops the children and releases shared memory), then after quitGrace
// SIGKILL for the postmaster and all its children.
func (s *Server) terminate() {
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	t := time.NewTimer(quitGrace)
	defer t.Stop()
	select {
	case <-s.exited:
		return
	case <-t.C:
	}
	// Stop the postmaster so that it cannot fork while its children are
	// collected, then kill them and it. Backends run in sessions of their
	// own, so killing the process group would miss them.
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err == nil {
		for _, pid := range procfs.Children(s.cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// removeDirs removes what Start created: the temporary Dir and socket
// directory. A caller-supplied Dir is kept.
func (s *Server) removeDirs() error {
	var errs []error
	if s.removeSock && s.sockDir != "" {
		if err := os.RemoveAll(s.sockDir); err != nil {
			errs = append(errs, fmt.Errorf("pgserver: %w", err))
		}
	}
	if s.removeDir && s.dir != "" {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgserver: %w", err))
		}
	}
	return errors.Join(errs...)
}

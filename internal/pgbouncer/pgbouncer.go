// Package pgbouncer starts Debian's PgBouncer as a child process in front
// of a PostgreSQL server, for tests and the local cluster: the transaction
// pooler that most production PostgreSQL deployments put between their
// applications and the server (apt-get install pgbouncer).
//
// Start writes a configuration for one upstream server (every database
// name is passed through to it), runs pgbouncer on a free port of
// 127.0.0.1 and waits until it answers. As root, PgBouncer (which refuses
// to run as root) runs as the "postgres" OS user, as pgserver runs
// PostgreSQL. Kill and Restart let a test break it mid-traffic.
package pgbouncer

import (
	"context"
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

	"github.com/idemcoord/idem/internal/pgserver"
)

// ErrNotInstalled is returned when no pgbouncer binary is found.
var ErrNotInstalled = errors.New("pgbouncer is not installed (Debian: apt-get install pgbouncer)")

// Pool modes PgBouncer knows (its pool_mode setting).
const (
	ModeSession     = "session"
	ModeTransaction = "transaction"
	ModeStatement   = "statement"
)

// QueryExecMode is the pgx query mode a client behind a transaction pooler
// uses: the extended protocol with unnamed statements, each statement's
// Parse, Bind and Execute in one round trip, so nothing outlives a
// transaction on the server connection the pooler lent it. PgBouncer 1.18
// (Debian 12) keeps no named prepared statements across transactions.
const QueryExecMode = "exec"

// Options configure Start.
type Options struct {
	// Upstream is the PostgreSQL server's host:port. Required.
	Upstream string
	// User is the role clients log in as (trusted: PgBouncer passes it
	// on to the server). Default "postgres", pgserver's superuser.
	User string
	// PoolMode is PgBouncer's pool_mode. Default ModeTransaction.
	PoolMode string
	// PoolSize is default_pool_size, the server connections per database
	// and user. Default 20.
	PoolSize int
	// Dir holds the configuration and the log. Default: a new temporary
	// directory, removed by Stop.
	Dir string
	// Port is the port at 127.0.0.1. Default 0: a free one.
	Port int
	// Logger receives start and stop messages. Default: discard.
	Logger *slog.Logger
}

// Server is a running PgBouncer. Its methods are safe for concurrent use;
// call Stop when done.
type Server struct {
	opts      Options
	dir       string
	removeDir bool
	port      int
	bin       string
	cred      *syscall.Credential
	log       *slog.Logger

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs PgBouncer and returns once it accepts connections and reaches
// the upstream server. ctx bounds the start only.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Upstream == "" {
		return nil, errors.New("pgbouncer: Options.Upstream is required")
	}
	if opts.User == "" {
		opts.User = "postgres"
	}
	if opts.PoolMode == "" {
		opts.PoolMode = ModeTransaction
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 20
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			return nil, ErrNotInstalled
		}
	}
	cred, err := pgserver.Credential()
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, bin: bin, cred: cred, log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.dir = opts.Dir; s.dir == "" {
		// Under /tmp, not t.TempDir: the postgres OS user must reach it.
		if s.dir, err = os.MkdirTemp("", "pgbouncer-"); err != nil {
			return nil, fmt.Errorf("pgbouncer: %w", err)
		}
		s.removeDir = true
	} else if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if err := pgserver.Chown(s.dir, cred); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if s.port = opts.Port; s.port == 0 {
		if s.port, err = freePort(); err != nil {
			s.cleanup()
			return nil, err
		}
	}
	if err := s.writeConfig(); err != nil {
		s.cleanup()
		return nil, err
	}
	if err := s.start(ctx); err != nil {
		s.cleanup()
		return nil, err
	}
	s.log.Info("pgbouncer: started", "port", s.port, "pool_mode", opts.PoolMode, "upstream", opts.Upstream)
	return s, nil
}

// writeConfig writes pgbouncer.ini and the users file.
func (s *Server) writeConfig() error {
	host, port, err := net.SplitHostPort(s.opts.Upstream)
	if err != nil {
		return fmt.Errorf("pgbouncer: upstream %q: %w", s.opts.Upstream, err)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 2000
server_reset_query = DISCARD ALL
server_check_delay = 1
server_connect_timeout = 5
server_login_retry = 1
logfile = %s
log_connections = 0
log_disconnections = 0
`, host, port, s.port, filepath.Join(s.dir, "users.txt"), s.opts.PoolMode, s.opts.PoolSize, s.LogPath())
	for name, body := range map[string]string{
		"pgbouncer.ini": ini,
		"users.txt":     fmt.Sprintf("%q \"\"\n", s.opts.User),
	} {
		path := filepath.Join(s.dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
		if err := pgserver.Chown(path, s.cred); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
	}
	return nil
}

// start runs the process and waits until it answers.
func (s *Server) start(ctx context.Context) error {
	cmd := exec.Command(s.bin, filepath.Join(s.dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	if err := pgserver.StartLocked(cmd, func(error) {}, exited); err != nil {
		return fmt.Errorf("pgbouncer: start: %w", err)
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	for {
		err := s.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("pgbouncer: exited at start: %s", s.logTail())
		case <-ctx.Done():
			s.Kill()
			return fmt.Errorf("pgbouncer: not ready (%v): %w", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping connects through PgBouncer to the upstream's postgres database.
func (s *Server) ping(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, s.URLFor("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(cctx)
}

// URLFor returns the URL of database db through PgBouncer, in the query
// mode a transaction pooler needs (default_query_exec_mode=exec).
func (s *Server) URLFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(s.opts.User),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable&default_query_exec_mode=" + QueryExecMode,
	}
	return u.String()
}

// Via returns dbURL (a URL of the upstream server) through PgBouncer: the
// same user, database and parameters, PgBouncer's address, and
// default_query_exec_mode=exec.
func (s *Server) Via(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("pgbouncer: %w", err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	q := u.Query()
	q.Set("default_query_exec_mode", QueryExecMode)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Port returns the port PgBouncer listens on at 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Pid returns PgBouncer's process id (0 when it is not running).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// LogPath is PgBouncer's log file.
func (s *Server) LogPath() string { return filepath.Join(s.dir, "pgbouncer.log") }

// Kill ends PgBouncer with SIGKILL, as a crash would: every client and
// server connection drops, whatever was in flight. It waits for the
// process to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Restart starts PgBouncer again on the same port after Kill.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		return errors.New("pgbouncer: restart: still running")
	}
	return s.start(ctx)
}

// Stop ends PgBouncer and removes the directory Start made.
func (s *Server) Stop() {
	s.Kill()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.removeDir {
		_ = os.RemoveAll(s.dir)
	}
}

// logTail returns the end of PgBouncer's log, for errors.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.LogPath())
	if err != nil {
		return "(no log)"
	}
	const tail = 2048
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return strings.TrimSpace(string(b))
}

// freePort asks the kernel for a free port of 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgbouncer: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

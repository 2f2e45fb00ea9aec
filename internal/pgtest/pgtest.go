// Package pgtest gives tests their own empty PostgreSQL databases on one
// throwaway server shared by the whole test binary.
//
// A package whose tests need PostgreSQL calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// and each test calls NewDatabase for a fresh database:
//
//	db := pgtest.NewDatabase(t) // postgres://... URL, dropped after the test
//
// Main starts the server with pgserver (PostgreSQL must be installed; on
// Debian: apt-get install postgresql). To use an existing server instead,
// set IDEM_TEST_DATABASE_URL to a postgres:// URL of a role that may create
// databases; Main then starts nothing.
//
// NewPooledDatabase gives a database reached through PgBouncer in
// transaction pooling (Debian's pgbouncer; one per test binary, started on
// first use), as most production PostgreSQL is reached. With
// IDEM_TEST_POOLER=pgbouncer, NewDatabase does the same, so that a whole
// package's tests run through the pooler.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemcoord/idem/internal/pgbouncer"
	"github.com/idemcoord/idem/internal/pgserver"
)

// EnvURL names the environment variable that points Main at an existing
// server instead of starting one.
const EnvURL = "IDEM_TEST_DATABASE_URL"

// EnvPooler names the environment variable that, set to "pgbouncer", makes
// NewDatabase return databases reached through PgBouncer in transaction
// pooling (NewPooledDatabase).
const EnvPooler = "IDEM_TEST_POOLER"

const (
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
	ddlTimeout   = time.Minute
	// maxNameLen is PostgreSQL's identifier limit (NAMEDATALEN-1 bytes).
	maxNameLen = 63
)

// shared is the server of this test binary. Main sets it before running
// the tests and clears it after.
var shared atomic.Pointer[server]

// seq numbers the databases of this process.
var seq atomic.Uint64

type server struct {
	admin *url.URL // connects to a database that is never dropped

	bouncerOnce sync.Once
	bouncer     *pgbouncer.Server // the binary's shared PgBouncer, started on first use
	bouncerErr  error
}

// stopBouncer stops the shared PgBouncer, if one was started.
func (s *server) stopBouncer() {
	if s.bouncer != nil {
		s.bouncer.Stop()
	}
}

// Main starts one shared throwaway server for a test binary; use from
// TestMain: os.Exit(pgtest.Main(m)). It runs m.Run between starting and
// stopping the server and returns its exit code, or 1 (with a message on
// stderr) if the server cannot be started or stopped.
//
// If IDEM_TEST_DATABASE_URL is set, it uses that server instead (must allow
// CREATE DATABASE) and starts nothing.
func Main(m *testing.M) int {
	return run(m)
}

// MainLeakChecked is Main followed, when the tests passed, by a check that no
// goroutine outlived them (go.uber.org/goleak): every pool, server and
// worker a test started must have been closed.
func MainLeakChecked(m *testing.M) int {
	code := run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutine leak:", err)
			code = 1
		}
	}
	return code
}

func run(m *testing.M) int {
	if raw := os.Getenv(EnvURL); raw != "" {
		u, err := parseURL(raw)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %s: %v\n", EnvURL, err)
			return 1
		}
		srv := &server{admin: u}
		shared.Store(srv)
		defer shared.Store(nil)
		defer srv.stopBouncer()
		return m.Run()
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: start PostgreSQL for the tests (or set %s): %v\n", EnvURL, err)
		return 1
	}
	u, err := parseURL(srv.URL())
	if err != nil { // cannot happen: pgserver makes the URL
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	shared.Store(&server{admin: u})
	code := m.Run()
	shared.Swap(nil).stopBouncer()

	ctx, cancel = context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stop PostgreSQL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("want a postgres:// URL, got scheme %q", u.Scheme)
	}
	return u, nil
}

// NewDatabase creates a fresh, uniquely named empty database on the shared
// server and returns its URL; dropped in t.Cleanup (ignore drop errors caused
// by open connections: use DROP DATABASE ... WITH (FORCE)).
//
// The caller should close its connections before the test ends; the drop
// terminates any that remain. NewDatabase is safe to call from parallel
// tests, and names are unique across test processes sharing a server. It
// fails the test if Main was not called.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	if os.Getenv(EnvPooler) == "pgbouncer" {
		return NewPooledDatabase(tb)
	}
	return newDatabase(tb)
}

// NewDirectDatabase is NewDatabase reached directly, whatever
// IDEM_TEST_POOLER says: for a test that starts a pooler of its own in
// front of it (NewPgBouncer).
func NewDirectDatabase(tb testing.TB) string {
	tb.Helper()
	return newDatabase(tb)
}

// NewPooledDatabase is NewDatabase reached through PgBouncer in
// transaction pooling: the URL is PgBouncer's, with the query mode a
// transaction pooler needs (default_query_exec_mode=exec). The PgBouncer
// is shared by the test binary, started on first use and stopped by Main.
func NewPooledDatabase(tb testing.TB) string {
	tb.Helper()
	srv := shared.Load()
	if srv == nil {
		tb.Fatal("pgtest: NewPooledDatabase needs the shared server started by pgtest.Main")
		return ""
	}
	srv.bouncerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		srv.bouncer, srv.bouncerErr = pgbouncer.Start(ctx, pgbouncer.Options{Upstream: srv.admin.Host, User: srv.admin.User.Username(), PoolSize: 40})
	})
	if srv.bouncerErr != nil {
		tb.Fatalf("pgtest: %v", srv.bouncerErr)
	}
	via, err := srv.bouncer.Via(newDatabase(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return via
}

// NewPgBouncer starts a PgBouncer of the test's own in front of the shared
// server, in pool mode mode (pgbouncer.ModeTransaction, ...), with poolSize
// server connections (0: PgBouncer's default here, 20); it is stopped in
// tb.Cleanup. Its Via turns a NewDirectDatabase URL into one through it.
func NewPgBouncer(tb testing.TB, mode string, poolSize int) *pgbouncer.Server {
	tb.Helper()
	srv := shared.Load()
	if srv == nil {
		tb.Fatal("pgtest: NewPgBouncer needs the shared server started by pgtest.Main")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: srv.admin.Host, User: srv.admin.User.Username(), PoolMode: mode, PoolSize: poolSize})
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(b.Stop)
	return b
}

func newDatabase(tb testing.TB) string {
	tb.Helper()
	srv := shared.Load()
	if srv == nil {
		tb.Fatal("pgtest: NewDatabase needs the shared server started by pgtest.Main; " +
			"add to this package's tests: func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }")
		return ""
	}
	name := databaseName(tb.Name())
	ident := pgx.Identifier{name}.Sanitize()

	ctx, cancel := context.WithTimeout(context.Background(), ddlTimeout)
	defer cancel()
	if err := srv.exec(ctx, "CREATE DATABASE "+ident); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ddlTimeout)
		defer cancel()
		if err := srv.exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})

	u := *srv.admin
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

// exec runs one statement on a connection of its own.
func (s *server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.admin.String())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// databaseName makes a valid, unique database name that shows which test
// it belongs to: t_<pid>_<seq>_<random>_<test name>, cut to 63 bytes.
func databaseName(testName string) string {
	var r [3]byte
	_, _ = rand.Read(r[:]) // never fails
	name := fmt.Sprintf("t_%d_%d_%s_", os.Getpid(), seq.Add(1), hex.EncodeToString(r[:]))
	var b strings.Builder
	b.WriteString(name)
	for _, c := range strings.ToLower(testName) {
		if b.Len() >= maxNameLen {
			break
		}
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

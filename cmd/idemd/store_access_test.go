package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// runInProcess parses args (plus a listen address) and runs idemd in this
// process; it returns Run's error, closing the node either way.
func runInProcess(t *testing.T, args ...string) error {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--recovery-interval", "0", "--outbox-interval", "0", "--cleanup-interval", "0"}, args...), func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil && cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	return err
}

// TestStoreVerifyFull: idemd's store connects to a PostgreSQL server with
// TLS, verifying its certificate and name against a CA (sslmode=verify-full)
// and serves; against another CA it stops at start with a certificate error.
func TestStoreVerifyFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	if _, err := srv.CreateDatabase(ctx, "idem"); err != nil {
		t.Fatal(err)
	}
	dbURL := srv.TLSURLFor("idem")
	if !strings.Contains(dbURL, "sslmode=verify-full") {
		t.Fatalf("URL %s, want verify-full", dbURL)
	}
	node := startIdemd(t, dbURL)
	if status, body, _ := pay(t, node.url, "tls-1"); status != http.StatusCreated {
		t.Fatalf("POST /payments over a verify-full store: %d %s\n%s", status, body, node.log)
	}
	if status, _, hdr := pay(t, node.url, "tls-1"); status != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d, replayed %q", status, hdr.Get("Idempotent-Replayed"))
	}

	u, _ := url.Parse(dbURL)
	q := u.Query()
	q.Set("sslrootcert", writeOtherCA(t))
	u.RawQuery = q.Encode()
	err = runInProcess(t, "--database-url", u.String())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("start against a store whose certificate another CA signed: %v, want a certificate error", err)
	}
}

// TestLeastPrivilegeRoles: migrations run as the role that owns the schema;
// the node runs as a role with only SELECT, INSERT, UPDATE and DELETE
// (--migrate=false), serves payments and runs its workers, and that role
// can run no DDL. Without --migrate=false it cannot start, and with it on a
// store nobody migrated it says what to run.
func TestLeastPrivilegeRoles(t *testing.T) {
	superURL := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	owner, app := "idem_migrator_"+suffix, "idem_app_"+suffix
	su, err := url.Parse(superURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(su.Path, "/")
	as := func(role string) string {
		u := *su
		u.User = url.User(role)
		return u.String()
	}
	exec := func(dbURL string, sqls ...string) error {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		for _, sql := range sqls {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	}
	ident := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	// The setup of deploy/README.md's "Database roles".
	if err := exec(superURL,
		"CREATE ROLE "+ident(owner)+" LOGIN",
		"CREATE ROLE "+ident(app)+" LOGIN",
		"ALTER DATABASE "+ident(db)+" OWNER TO "+ident(owner),
		"REVOKE ALL ON DATABASE "+ident(db)+" FROM PUBLIC",
		"GRANT CONNECT ON DATABASE "+ident(db)+" TO "+ident(app),
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE ON SCHEMA public TO "+ident(app),
		"ALTER DEFAULT PRIVILEGES FOR ROLE "+ident(owner)+" IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+ident(app),
	); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, superURL)
		if err != nil {
			t.Logf("drop roles: %v", err)
			return
		}
		defer conn.Close(context.Background())
		for _, sql := range []string{
			"ALTER DATABASE " + ident(db) + " OWNER TO CURRENT_USER",
			"ALTER DEFAULT PRIVILEGES FOR ROLE " + ident(owner) + " IN SCHEMA public REVOKE ALL ON TABLES FROM " + ident(app),
			"DROP OWNED BY " + ident(app),
			"DROP OWNED BY " + ident(owner),
			"DROP ROLE " + ident(app),
			"DROP ROLE " + ident(owner),
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})

	// Nobody migrated yet: the node says what to run.
	if err := runInProcess(t, "--database-url", as(app), "--migrate=false"); err == nil || !strings.Contains(err.Error(), "idemctl migrate") {
		t.Errorf("--migrate=false on an unmigrated store: %v, want an error naming idemctl migrate", err)
	}
	if err := runMigrations(ctx, as(owner)); err != nil {
		t.Fatalf("migrations as %s: %v", owner, err)
	}
	// The node's role may not migrate.
	if err := runInProcess(t, "--database-url", as(app)); err == nil {
		t.Error("idemd as the DML-only role applied migrations at start")
	}

	node := startIdemd(t, as(app), "--migrate=false", "--outbox-interval", "20ms")
	status, first, _ := pay(t, node.url, "roles-1")
	if status != http.StatusCreated {
		t.Fatalf("POST /payments as %s: %d %s\n%s", app, status, first, node.log)
	}
	if status, again, hdr := pay(t, node.url, "roles-1"); status != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" || string(again) != string(first) {
		t.Errorf("replay as %s: %d, replayed %q", app, status, hdr.Get("Idempotent-Replayed"))
	}
	// The outbox publisher and consumers work with DML only.
	for {
		var n int
		conn, err := pgx.Connect(ctx, superURL)
		if err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRow(ctx, "SELECT count(*) FROM ledger_entries").Scan(&n)
		_ = conn.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no ledger entry: the outbox did not run as %s\n%s", app, node.log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if strings.Contains(node.log.String(), "permission denied") {
		t.Errorf("the node met a permission it lacks:\n%s", node.log)
	}

	// No DDL for the node's role.
	for _, sql := range []string{
		"CREATE TABLE intruder (i int)",
		"ALTER TABLE payments ADD COLUMN intruder int",
		"DROP TABLE idempotency_records",
		"TRUNCATE payments",
		"CREATE INDEX intruder ON payments (created_at)",
		"CREATE TEMP TABLE intruder (i int)",
	} {
		err := exec(as(app), sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: %v, want permission denied (42501)", sql, app, err)
		}
	}
}

// runMigrations applies the migrations as idemctl migrate does.
func runMigrations(ctx context.Context, dbURL string) error {
	st, err := store.Open(ctx, dbURL, store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	return payments.Migrate(ctx, st)
}

// writeOtherCA writes the certificate of a new CA that signed nothing and
// returns its path.
func writeOtherCA(t *testing.T) string {
	t.Helper()
	ca, err := tlsutil.NewCA(t.TempDir(), "another CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertFile
}

package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idemcoord/idem/internal/pgtest"
)

// TestSplitStatements: a file splits at the semicolons that end
// statements, not at those inside strings, quoted identifiers,
// dollar-quoted bodies or comments; comments before a statement are
// dropped, and each statement knows its line.
func TestSplitStatements(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []statement
	}{
		{"plain", "CREATE TABLE a (i INT);\nCREATE INDEX IF NOT EXISTS a_i ON a (i);\n",
			[]statement{{"CREATE TABLE a (i INT)", 1}, {"CREATE INDEX IF NOT EXISTS a_i ON a (i)", 2}}},
		{"no final semicolon, empty statements", ";;\nSELECT 1;;\n\nSELECT 2",
			[]statement{{"SELECT 1", 2}, {"SELECT 2", 4}}},
		{"comments", "-- a; comment\n/* a /* nested; */ block; */\nSELECT 1 -- trailing; comment\n, 2;\n-- only a comment at the end;",
			[]statement{{"SELECT 1 -- trailing; comment\n, 2", 3}}},
		{"strings", "SELECT 'a;b', 'it''s; here', E'\\'; still', e'\\\\';\nSELECT 2;",
			[]statement{{`SELECT 'a;b', 'it''s; here', E'\'; still', e'\\'`, 1}, {"SELECT 2", 2}}},
		{"not an E string", "SELECT name'x;y' FROM t;",
			[]statement{{"SELECT name'x;y' FROM t", 1}}},
		{"quoted identifiers", `CREATE TABLE "a;b" ("c""; d" INT);`,
			[]statement{{`CREATE TABLE "a;b" ("c""; d" INT)`, 1}}},
		{"dollar quotes", "DO $$ BEGIN PERFORM 1; END $$;\nCREATE FUNCTION f() RETURNS INT LANGUAGE sql AS $body$ SELECT 1; $$ $body$;\nSELECT $1::INT, a$b FROM t;",
			[]statement{{"DO $$ BEGIN PERFORM 1; END $$", 1}, {"CREATE FUNCTION f() RETURNS INT LANGUAGE sql AS $body$ SELECT 1; $$ $body$", 2}, {"SELECT $1::INT, a$b FROM t", 3}}},
		{"lines across a multi-line string", "SELECT '\n\n';\nSELECT 2;",
			[]statement{{"SELECT '\n\n'", 1}, {"SELECT 2", 4}}},
	} {
		got, err := splitStatements(tc.file)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n got  %#v\n want %#v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct{ file, want string }{
		{"SELECT 'unterminated;", "line 1: unterminated string"},
		{"SELECT 1;\nSELECT \"x;", "line 2: unterminated quoted identifier"},
		{"SELECT 1; /* x", "unterminated /* comment"},
		{"DO $x$ BEGIN END $y$;", "unterminated dollar-quoted body $x$"},
		{"BEGIN;\nCREATE TABLE a (i INT);\nCOMMIT;", "line 1: BEGIN: a migration file may not control transactions"},
		{"CREATE TABLE a (i INT);\n  commit", "line 2: COMMIT"},
		{"START TRANSACTION;", "START"},
		{"SAVEPOINT s;", "SAVEPOINT"},
	} {
		if _, err := splitStatements(tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("splitStatements(%q) = %v, want %q", tc.file, err, tc.want)
		}
	}
}

// openMigrationStore is a store on url, closed when the test ends.
func openMigrationStore(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// shortLockTiming lets a lock that is not refreshed expire within the
// test, with a ttl twenty refreshes long, so that a loaded machine's
// stalls do not let a refreshed lock expire.
var shortLockTiming = migrationLockTiming{ttl: 2 * time.Second, refresh: 100 * time.Millisecond, poll: 20 * time.Millisecond}

// slowSet is a set whose one file counts its runs and then takes longer
// than shortLockTiming's ttl, followed by a statement whose effect shows
// that it got to the end.
func slowSet() Migrations {
	return Migrations{Name: "slow", FS: fstest.MapFS{"0001_slow.sql": {Data: []byte(`
CREATE SEQUENCE IF NOT EXISTS slow_runs;
SELECT nextval('slow_runs');
SELECT pg_sleep(3);
CREATE TABLE IF NOT EXISTS slow_done (i INT);
`)}}}
}

// waitForMigrationLock waits until someone holds the migration lock.
func waitForMigrationLock(t *testing.T, s *Store) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations_lock`).Scan(&n)
		if err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody took the migration lock: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countRows(t *testing.T, s *Store, query string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestMigrationLockIsRefreshedDuringALongMigration: a migration that runs
// longer than the lock's ttl keeps the lock by refreshing it, so a second
// process waits instead of taking it over, and finds the file applied.
func TestMigrationLockIsRefreshedDuringALongMigration(t *testing.T) {
	url := pgtest.NewDatabase(t)
	first, second := openMigrationStore(t, url), openMigrationStore(t, url)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- first.migrate(ctx, shortLockTiming, []Migrations{slowSet()}) }()
	waitForMigrationLock(t, second)
	if err := second.migrate(ctx, shortLockTiming, []Migrations{slowSet()}); err != nil {
		t.Errorf("second Migrate: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("first Migrate: %v", err)
	}
	if n := countRows(t, second, `SELECT last_value FROM slow_runs`); n != 1 {
		t.Errorf("the slow migration ran %d times, want once: the lock was taken over while held", n)
	}
	if n := countRows(t, second, `SELECT count(*) FROM schema_migrations_lock`); n != 0 {
		t.Error("the lock is still held")
	}
}

// TestMigrationStopsWhenItsLockIsTakenOver: a holder that finds its lock
// taken over (it was not refreshed in time) stops at once, without
// recording the file it was running, and fails saying so.
func TestMigrationStopsWhenItsLockIsTakenOver(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openMigrationStore(t, url)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- s.migrate(ctx, shortLockTiming, []Migrations{slowSet()}) }()
	waitForMigrationLock(t, s)
	if _, err := s.pool.Exec(ctx, `UPDATE schema_migrations_lock SET owner = 'another:1:x', expires_at = now() + INTERVAL '1 minute'`); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if !errors.Is(err, errMigrationLockLost) {
		t.Fatalf("Migrate after its lock was taken over = %v, want errMigrationLockLost", err)
	}
	if n := countRows(t, s, `SELECT count(*) FROM schema_migrations WHERE set_name = 'slow'`); n != 0 {
		t.Error("the interrupted file was recorded")
	}
	if n := countRows(t, s, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'slow_done'`); n != 0 {
		t.Error("the interrupted file ran to its end")
	}
	if n := countRows(t, s, `SELECT count(*) FROM schema_migrations_lock WHERE owner = 'another:1:x'`); n != 1 {
		t.Error("the stopped holder released a lock no longer its own")
	}
}

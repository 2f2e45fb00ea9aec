package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// openEmptyDatabase returns a store on a new database nothing has migrated,
// and its URL.
func openEmptyDatabase(t *testing.T) (*store.Store, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	return openStore(t, url), url
}

// openStore opens another store (another pool: another process, as far
// as the database can tell) on url, closed when the test ends.
func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// migrationSet is a set named name of the given files (file name to SQL).
func migrationSet(name string, files map[string]string) store.Migrations {
	m := fstest.MapFS{}
	for f, sql := range files {
		m[f] = &fstest.MapFile{Data: []byte(sql)}
	}
	return store.Migrations{Name: name, FS: m}
}

// ordersSet is a user's set for an operation of their own: a version 0001
// beside the engine's 0001, and a 0011 that the engine's next migration
// would have collided with in one sequence. 0011 counts its runs in a
// sequence and takes a while, so that processes migrating at once would
// overlap in it if they could.
func ordersSet() store.Migrations {
	return migrationSet("orders", map[string]string{
		"0001_orders.sql": `-- An operation's own table.
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT NOT NULL PRIMARY KEY,
    note     TEXT NOT NULL DEFAULT 'a '';'' inside a string'
);`,
		"0011_order_lines.sql": `CREATE TABLE IF NOT EXISTS order_lines (
    order_id TEXT NOT NULL,
    line     INT  NOT NULL,
    PRIMARY KEY (order_id, line)
);
CREATE SEQUENCE IF NOT EXISTS order_lines_migration_runs;
SELECT nextval('order_lines_migration_runs');
SELECT pg_sleep(0.2);`,
	})
}

// auditSet is another user's set with a version 0011 of its own.
func auditSet() store.Migrations {
	return migrationSet("audit", map[string]string{
		"0011_audit.sql": `CREATE TABLE IF NOT EXISTS audit_events (event_id TEXT NOT NULL PRIMARY KEY);`,
	})
}

// recordedMigration is a row of schema_migrations.
type recordedMigration struct {
	Set     string
	Version int
	Name    string
}

func recordedMigrations(t *testing.T, st *store.Store) []recordedMigration {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `SELECT set_name, version, name FROM schema_migrations ORDER BY set_name, version`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[recordedMigration])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// wantEveryFileRecordedOnce checks that schema_migrations has exactly one
// row per file of the engine's set and of sets, under its set, and nothing
// else.
func wantEveryFileRecordedOnce(t *testing.T, st *store.Store, sets ...store.Migrations) {
	t.Helper()
	var want []recordedMigration
	for _, set := range append([]store.Migrations{store.EngineMigrations()}, sets...) {
		files, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			var v int
			if _, err := fmt.Sscanf(f, "%d_", &v); err != nil {
				t.Fatal(err)
			}
			want = append(want, recordedMigration{set.Name, v, f})
		}
	}
	order := func(a, b recordedMigration) int {
		return strings.Compare(fmt.Sprintf("%s/%06d", a.Set, a.Version), fmt.Sprintf("%s/%06d", b.Set, b.Version))
	}
	slices.SortFunc(want, order)
	got := recordedMigrations(t, st)
	slices.SortFunc(got, order)
	if !slices.Equal(got, want) {
		t.Errorf("schema_migrations:\n got  %v\n want %v", got, want)
	}
}

// schemaOf describes the database's tables, columns, sequences and indexes,
// for comparing two databases.
func schemaOf(t *testing.T, st *store.Store) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, q := range []string{
		// Columns by name: a column added by an upgrade comes last.
		`SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
			FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY table_name, column_name`,
		`SELECT indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY indexname`,
		`SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = current_schema() ORDER BY sequence_name`,
	} {
		rows, err := st.Pool().Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	return b.String()
}

// wantSchemaOfAFreshMigrate checks that st's database has the schema one
// Migrate of sets gives a new database.
func wantSchemaOfAFreshMigrate(t *testing.T, st *store.Store, sets ...store.Migrations) {
	t.Helper()
	ref, _ := openEmptyDatabase(t)
	if err := ref.Migrate(context.Background(), sets...); err != nil {
		t.Fatal(err)
	}
	if got, want := schemaOf(t, st), schemaOf(t, ref); got != want {
		t.Errorf("schema differs from one Migrate's on a new database:\n got:\n%s\n want:\n%s", got, want)
	}
}

func count(t *testing.T, st *store.Store, query string, args ...any) int {
	t.Helper()
	var n int
	if err := st.Pool().QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func wantMigrationLockFree(t *testing.T, st *store.Store) {
	t.Helper()
	if n := count(t, st, `SELECT count(*) FROM schema_migrations_lock`); n != 0 {
		t.Errorf("the migration lock is still held (%d rows) after Migrate returned", n)
	}
}

// migrateAtOnce runs Migrate(sets...) from n stores on url at the same
// moment, each in its own goroutine, and returns their errors.
func migrateAtOnce(t *testing.T, url string, n int, sets ...store.Migrations) []error {
	t.Helper()
	stores := make([]*store.Store, n)
	for i := range stores {
		stores[i] = openStore(t, url)
		if err := stores[i].Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, st := range stores {
		wg.Go(func() {
			<-start
			errs[i] = st.Migrate(ctx, sets...)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// TestConcurrentMigrateRecordsEachVersionOnce: three processes migrating a
// new database at once take turns; each version is recorded once, each
// file ran once, and the schema is whole.
func TestConcurrentMigrateRecordsEachVersionOnce(t *testing.T) {
	st, url := openEmptyDatabase(t)
	sets := []store.Migrations{payments.Migrations(), ordersSet()}
	for i, err := range migrateAtOnce(t, url, 3, sets...) {
		if err != nil {
			t.Errorf("Migrate %d: %v", i, err)
		}
	}
	wantEveryFileRecordedOnce(t, st, sets...)
	if n := count(t, st, `SELECT last_value FROM order_lines_migration_runs`); n != 1 {
		t.Errorf("0011_order_lines.sql ran %d times, want once", n)
	}
	wantSchemaOfAFreshMigrate(t, st, sets...)
	wantMigrationLockFree(t, st)
	if err := st.CheckMigrated(context.Background(), sets...); err != nil {
		t.Error(err)
	}
}

// TestUserSetBesideEngineAndPayments: a user's set with a version 0001 and
// a 0011, and another set with a 0011 of its own, apply beside the
// engine's and payments' sets on a new database, each version in its
// set's namespace.
func TestUserSetBesideEngineAndPayments(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	sets := []store.Migrations{payments.Migrations(), ordersSet(), auditSet()}
	if err := st.Migrate(ctx, sets...); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, sets...)
	for _, table := range []string{"idempotency_records", "payments", "orders", "order_lines", "audit_events"} {
		if n := count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name = $1`, table); n != 1 {
			t.Errorf("table %s was not created", table)
		}
	}
	if err := st.CheckMigrated(ctx, sets...); err != nil {
		t.Error(err)
	}
	status, err := st.MigrationStatus(ctx, sets...)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.SetStatus{
		{Name: "engine", Applied: []int{1, 4, 6, 7, 8, 10, 11, 12}},
		{Name: "payments", Applied: []int{2, 3, 5, 9}},
		{Name: "orders", Applied: []int{1, 11}},
		{Name: "audit", Applied: []int{11}},
	}
	if fmt.Sprint(status) != fmt.Sprint(want) {
		t.Errorf("MigrationStatus = %v, want %v", status, want)
	}
	if err := st.Migrate(ctx, sets...); err != nil {
		t.Errorf("Migrate again: %v", err)
	}
	wantEveryFileRecordedOnce(t, st, sets...)
	if n := count(t, st, `SELECT last_value FROM order_lines_migration_runs`); n != 1 {
		t.Errorf("0011_order_lines.sql ran %d times, want once", n)
	}
}

// migrateAsThePreviousRelease gives st's database what the previous
// release left: schema_migrations keyed by version alone, one sequence for
// every set, and the engine's and payments' files applied and recorded
// there.
func migrateAsThePreviousRelease(t *testing.T, st *store.Store) {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := st.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE schema_migrations (
		version    INT         NOT NULL PRIMARY KEY,
		name       TEXT        NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	type file struct {
		version int
		name    string
		set     store.Migrations
	}
	var files []file
	for _, set := range []store.Migrations{store.EngineMigrations(), payments.Migrations()} {
		names, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range names {
			var v int
			if _, err := fmt.Sscanf(f, "%d_", &v); err != nil {
				t.Fatal(err)
			}
			files = append(files, file{v, f, set})
		}
	}
	slices.SortFunc(files, func(a, b file) int { return a.version - b.version })
	for _, f := range files {
		body, err := fs.ReadFile(f.set.FS, f.name)
		if err != nil {
			t.Fatal(err)
		}
		exec(string(body))
		exec(`INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, f.version, f.name)
	}
}

// TestPreviousReleaseDatabaseUpgradesConcurrently: on a database the
// previous release migrated, three processes migrating at once with a
// user's set upgrade schema_migrations in place: the old rows go to the
// sets whose files they name, the user's 0011 applies in its own
// namespace, and the result is what a new database gets.
func TestPreviousReleaseDatabaseUpgradesConcurrently(t *testing.T) {
	ctx := context.Background()
	st, url := openEmptyDatabase(t)
	migrateAsThePreviousRelease(t, st)
	sets := []store.Migrations{payments.Migrations(), ordersSet()}
	// A node of this release with migrations off reads the old layout.
	if err := st.CheckMigrated(ctx, sets...); err == nil || !strings.Contains(err.Error(), "orders 0001_orders.sql") ||
		strings.Contains(err.Error(), "engine") || strings.Contains(err.Error(), "payments") {
		t.Errorf("CheckMigrated on the previous layout = %v; want only the orders set missing", err)
	}
	for i, err := range migrateAtOnce(t, url, 3, sets...) {
		if err != nil {
			t.Errorf("Migrate %d: %v", i, err)
		}
	}
	wantEveryFileRecordedOnce(t, st, sets...)
	wantSchemaOfAFreshMigrate(t, st, sets...)
	wantMigrationLockFree(t, st)
	if err := st.CheckMigrated(ctx, sets...); err != nil {
		t.Error(err)
	}
}

// TestPreviousReleaseUpgradeCutShortResumes: an upgrade that stopped after
// its first step (the set column added, the key still the version) is
// finished by the next Migrate.
func TestPreviousReleaseUpgradeCutShortResumes(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	migrateAsThePreviousRelease(t, st)
	if _, err := st.Pool().Exec(ctx, `ALTER TABLE schema_migrations ADD COLUMN set_name TEXT NOT NULL DEFAULT ''`); err != nil {
		t.Fatal(err)
	}
	sets := []store.Migrations{payments.Migrations(), ordersSet()}
	if err := st.Migrate(ctx, sets...); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, sets...)
	wantSchemaOfAFreshMigrate(t, st, sets...)
}

// TestPreviousReleaseRowsWaitForTheirSet: on a database the previous
// release migrated, the engine's set alone attributes its own rows and
// leaves payments' unattributed, which still count as applied for
// payments; payments' Migrate then claims them. A row the previous
// release writes after the upgrade (a node of it still migrating) is
// absorbed.
func TestPreviousReleaseRowsWaitForTheirSet(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	migrateAsThePreviousRelease(t, st)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st, `SELECT count(*) FROM schema_migrations WHERE set_name = ''`); n != 4 {
		t.Errorf("%d rows unattributed after the engine's Migrate; want payments' 4", n)
	}
	if err := payments.CheckMigrated(ctx, st); err != nil {
		t.Errorf("payments.CheckMigrated before payments claimed its rows: %v", err)
	}
	status, err := st.MigrationStatus(ctx, payments.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(status); got != "[{engine [1 4 6 7 8 10 11 12] [] []} {payments [2 3 5 9] [] []}]" {
		t.Errorf("MigrationStatus = %s", got)
	}
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, payments.Migrations())

	// The previous release records a version without a set.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES (2, '0002_payments.sql') ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, payments.Migrations())
}

// TestMigrationFailingMidwayIsRerunnable: a file whose second statement
// fails keeps its first statement's effect, is not recorded, and leaves
// the lock free; Migrate with the file fixed runs it again from its first
// statement and records it.
func TestMigrationFailingMidwayIsRerunnable(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	broken := migrationSet("orders", map[string]string{
		"0001_orders.sql": `CREATE TABLE IF NOT EXISTS orders (order_id TEXT NOT NULL PRIMARY KEY);
CREATE INDEX IF NOT EXISTS orders_by_customer ON orders (customer_id);
CREATE TABLE IF NOT EXISTS order_lines (order_id TEXT NOT NULL);`,
	})
	err := st.Migrate(ctx, broken)
	if err == nil || !strings.Contains(err.Error(), "0001_orders.sql") || !strings.Contains(err.Error(), "statement 2 of 3 (line 2)") {
		t.Fatalf("Migrate with a failing second statement = %v; want the file and statement named", err)
	}
	wantEveryFileRecordedOnce(t, st) // the engine's, not the failed one
	if n := count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'orders'`); n != 1 {
		t.Error("the first statement's table is gone")
	}
	if n := count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'order_lines'`); n != 0 {
		t.Error("a statement after the failing one ran")
	}
	wantMigrationLockFree(t, st)
	if err := st.CheckMigrated(ctx, broken); err == nil || !strings.Contains(err.Error(), "orders 0001_orders.sql") {
		t.Errorf("CheckMigrated after the failure = %v; want the file named", err)
	}

	fixed := migrationSet("orders", map[string]string{
		"0001_orders.sql": `CREATE TABLE IF NOT EXISTS orders (order_id TEXT NOT NULL PRIMARY KEY);
ALTER TABLE orders ADD COLUMN IF NOT EXISTS customer_id TEXT;
CREATE INDEX IF NOT EXISTS orders_by_customer ON orders (customer_id);
CREATE TABLE IF NOT EXISTS order_lines (order_id TEXT NOT NULL);`,
	})
	if err := st.Migrate(ctx, fixed); err != nil {
		t.Fatalf("Migrate after the fix: %v", err)
	}
	wantEveryFileRecordedOnce(t, st, fixed)
	wantSchemaOfAFreshMigrate(t, st, fixed)
	wantMigrationLockFree(t, st)
}

// TestMigrationStatementsRunOutsideTransactions: each statement of a file
// is sent alone, outside any explicit transaction (CREATE INDEX
// CONCURRENTLY, which PostgreSQL refuses in a transaction block and in a
// query of several statements, runs).
func TestMigrationStatementsRunOutsideTransactions(t *testing.T) {
	st, _ := openEmptyDatabase(t)
	set := migrationSet("orders", map[string]string{
		"0001_orders.sql": `CREATE TABLE IF NOT EXISTS orders (order_id TEXT NOT NULL PRIMARY KEY, placed_at TIMESTAMPTZ);
CREATE INDEX CONCURRENTLY IF NOT EXISTS orders_placed_at ON orders (placed_at);`,
	})
	if err := st.Migrate(context.Background(), set); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, set)
}

// TestMigrationFilesMayNotControlTransactions: a file that begins and
// commits a transaction is refused before anything is applied.
func TestMigrationFilesMayNotControlTransactions(t *testing.T) {
	st, _ := openEmptyDatabase(t)
	set := migrationSet("orders", map[string]string{
		"0001_orders.sql": "BEGIN;\nCREATE TABLE IF NOT EXISTS orders (order_id TEXT);\nCOMMIT;\n",
	})
	err := st.Migrate(context.Background(), set)
	if err == nil || !strings.Contains(err.Error(), "0001_orders.sql") || !strings.Contains(err.Error(), "may not control transactions") {
		t.Fatalf("Migrate = %v; want the file refused", err)
	}
	if n := count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name IN ('orders', 'idempotency_records', 'schema_migrations')`); n != 0 {
		t.Errorf("%d tables were created before the file was refused", n)
	}
}

// TestMigrationSetsAreChecked: two files of one version in a set, and two
// different sets of one name, are refused before anything is applied.
func TestMigrationSetsAreChecked(t *testing.T) {
	st, _ := openEmptyDatabase(t)
	for _, tc := range []struct {
		set  store.Migrations
		want string
	}{
		{migrationSet("orders", map[string]string{"0001_a.sql": "SELECT 1", "0001_b.sql": "SELECT 1"}), "orders migration version 1 is both 0001_a.sql and 0001_b.sql"},
		{migrationSet("engine", map[string]string{"0001_records.sql": "SELECT 1"}), "two different migration sets are named engine"},
		{migrationSet("", map[string]string{"0001_a.sql": "SELECT 1"}), "needs a name"},
		{migrationSet("orders", map[string]string{"first.sql": "SELECT 1"}), "must start with a version number"},
	} {
		if err := st.Migrate(context.Background(), tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Migrate(%s) = %v, want %q", tc.set.Name, err, tc.want)
		}
	}
	if n := count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name IN ('idempotency_records', 'schema_migrations')`); n != 0 {
		t.Errorf("%d tables were created before the sets were refused", n)
	}
	// The engine's set given again is the engine's set.
	if err := st.Migrate(context.Background(), store.EngineMigrations()); err != nil {
		t.Errorf("Migrate(engine) = %v", err)
	}
}

// TestMigrateTakesOverAnExpiredLock: a lock whose holder died (its expiry
// passed by the store's clock) is taken over, and released after.
func TestMigrateTakesOverAnExpiredLock(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO schema_migrations_lock (name, owner, expires_at) VALUES ('migrate', 'crashed:1:x', now() - INTERVAL '1 second')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.Migrate(ctx, payments.Migrations()); err != nil {
		t.Fatal(err)
	}
	wantEveryFileRecordedOnce(t, st, payments.Migrations())
	wantMigrationLockFree(t, st)
}

// TestMigrateGivesUpOnAHeldLockAtTheDeadline: while another process holds
// the lock, Migrate waits until its context's deadline and then fails
// naming the holder, leaving the lock to it and applying nothing.
func TestMigrateGivesUpOnAHeldLockAtTheDeadline(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO schema_migrations_lock (name, owner, expires_at) VALUES ('migrate', 'other-host:42:abc', now() + INTERVAL '1 hour')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := st.Migrate(ctx, payments.Migrations())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "migration lock") || !strings.Contains(err.Error(), "other-host:42:abc") {
		t.Fatalf("Migrate while the lock is held = %v; want the deadline and the holder named", err)
	}
	if waited := time.Since(start); waited < 600*time.Millisecond {
		t.Errorf("gave up after %v, before the deadline", waited)
	}
	if n := count(t, st, `SELECT count(*) FROM schema_migrations_lock WHERE owner = 'other-host:42:abc'`); n != 1 {
		t.Error("the holder lost its lock to a waiter")
	}
	if n := count(t, st, `SELECT count(*) FROM schema_migrations WHERE set_name = 'payments'`); n != 0 {
		t.Error("a waiter applied migrations without the lock")
	}
}

// TestMigrationStatus: per set, what is applied and what pending, and
// versions the database has that the set's files do not.
func TestMigrationStatus(t *testing.T) {
	ctx := context.Background()
	st, _ := openEmptyDatabase(t)
	status, err := st.MigrationStatus(ctx, payments.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(status); got != "[{engine [] [1 4 6 7 8 10 11 12] []} {payments [] [2 3 5 9] []}]" {
		t.Errorf("MigrationStatus of a new database = %s", got)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO schema_migrations (set_name, version, name) VALUES ('engine', 99, '0099_later.sql')`); err != nil {
		t.Fatal(err)
	}
	status, err = st.MigrationStatus(ctx, payments.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(status); got != "[{engine [1 4 6 7 8 10 11 12] [] [99]} {payments [] [2 3 5 9] []}]" {
		t.Errorf("MigrationStatus after the engine's Migrate = %s", got)
	}
}

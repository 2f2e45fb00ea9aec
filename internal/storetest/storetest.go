// Package storetest opens a migrated store on a fresh throwaway database, for
// tests. The test binary's TestMain must call pgtest.Main.
package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// New returns a store on a new empty database, migrated for the engine and
// the payments operation (payments.Migrate), and its URL. The store
// is closed in t.Cleanup.
func New(tb testing.TB) (*store.Store, string) {
	tb.Helper()
	return Open(tb, pgtest.NewDatabase(tb))
}

// NewPooled is New on a database reached through PgBouncer in transaction
// pooling (pgtest.NewPooledDatabase).
func NewPooled(tb testing.TB) (*store.Store, string) {
	tb.Helper()
	return Open(tb, pgtest.NewPooledDatabase(tb))
}

// Open returns a store on url, migrated as New's is; it is closed in
// t.Cleanup.
func Open(tb testing.TB, url string) (*store.Store, string) {
	tb.Helper()
	st, err := store.Open(context.Background(), url, store.Options{MaxConns: 64})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(st.Close)
	if err := payments.Migrate(context.Background(), st); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	return st, url
}

// Count returns the result of a SELECT count(*) query.
func Count(tb testing.TB, st *store.Store, query string, args ...any) int {
	tb.Helper()
	var n int
	// Sessions run at SERIALIZABLE: beside concurrent writers a read may
	// fail with 40001, which Read retries as the store's own reads do.
	if err := st.Read(context.Background(), func(q store.Querier) error {
		return q.QueryRow(context.Background(), query, args...).Scan(&n)
	}); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// Exec runs a statement (test setup such as making a record stale).
func Exec(tb testing.TB, st *store.Store, query string, args ...any) {
	tb.Helper()
	if _, err := st.Pool().Exec(context.Background(), query, args...); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
}

// CountClaimAttempts installs a BEFORE INSERT trigger on
// idempotency_records that counts every row an INSERT proposes, including
// those that ON CONFLICT DO NOTHING then drops (PostgreSQL fires BEFORE
// INSERT row triggers before the conflict check). The count is a sequence, so
// attempts made by transactions that roll back are counted too. The returned
// function reports how many inserts were attempted, on any key, since the
// trigger went in.
func CountClaimAttempts(tb testing.TB, st *store.Store) func() int {
	tb.Helper()
	Exec(tb, st, `CREATE SEQUENCE IF NOT EXISTS test_claim_attempts`)
	Exec(tb, st, `CREATE OR REPLACE FUNCTION test_count_claim_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('test_claim_attempts'); RETURN NEW; END $$`)
	Exec(tb, st, `CREATE OR REPLACE TRIGGER test_count_claim_attempt BEFORE INSERT ON idempotency_records
		FOR EACH ROW EXECUTE FUNCTION test_count_claim_attempt()`)
	return func() int {
		tb.Helper()
		return Count(tb, st, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM test_claim_attempts`)
	}
}

// Age makes d pass for scope's record, by the store's clock: its lock,
// window and timestamps move d into the past, as if it had been written d
// earlier (coordtest.Target.Age). A record that does not exist fails the
// test.
func Age(tb testing.TB, st *store.Store, scope idem.Scope, d time.Duration) {
	tb.Helper()
	tag, err := st.Pool().Exec(context.Background(), `UPDATE idempotency_records SET
		locked_until = locked_until - $4::INT8 * INTERVAL '1 microsecond',
		expires_at = expires_at - $4::INT8 * INTERVAL '1 microsecond',
		created_at = created_at - $4::INT8 * INTERVAL '1 microsecond',
		updated_at = updated_at - $4::INT8 * INTERVAL '1 microsecond'
		WHERE tenant_id = $1 AND operation_name = $2 AND idempotency_key = $3`,
		scope.Tenant, scope.Operation, scope.Key, d.Microseconds())
	if err != nil {
		tb.Fatalf("age record %s by %v: %v", scope.Key, d, err)
	}
	if tag.RowsAffected() != 1 {
		tb.Fatalf("age record %s by %v: no such record", scope.Key, d)
	}
}

// SetSyncStandbys sets the server's synchronous_standby_names, waits until
// sessions see it, and replaces the store's connections. It changes the
// whole test server: tests that use it must not run in parallel.
func SetSyncStandbys(t testing.TB, st *store.Store, names string) {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	// The postmaster signals the server's processes once it has reloaded,
	// and each reloads before its next statement. Behind a transaction
	// pooler each read may go to another server process: the setting is
	// taken as reloaded once several reads in a row see it.
	for deadline, seen := time.Now().Add(30*time.Second), 0; ; {
		var got string
		err := st.Pool().QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&got)
		if err == nil && got == names {
			if seen++; seen < 5 {
				continue
			}
			// Whether a commit waits for synchronous standbys is not the
			// sessions' setting but a flag in shared memory that the
			// checkpointer sets when it reloads (sync_standbys_defined),
			// and a checkpointer in a checkpoint behind its schedule
			// reloads only once that checkpoint is done. A CHECKPOINT
			// returns after the checkpointer has handled the reload.
			if _, err := st.Pool().Exec(ctx, `CHECKPOINT`); err != nil {
				t.Fatal(err)
			}
			// Connections read the setting when they are made (and again
			// after half a minute): start new ones.
			st.Pool().Reset()
			return
		}
		seen = 0
		if time.Now().After(deadline) {
			t.Fatalf("synchronous_standby_names = %q, %v; want %q", got, err, names)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Statements runs fn under a recorded span and returns the verbs of the
// store statements it sent, in order: the store gives each round trip a
// span named "db <verb>" (a batch is one, named for its statement). fn's
// context ends after a minute.
func Statements(tb testing.TB, fn func(ctx context.Context)) []string {
	tb.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, root := tp.Tracer("test").Start(ctx, "root")
	fn(ctx)
	root.End()
	var verbs []string
	for _, s := range exp.GetSpans() {
		if v, ok := strings.CutPrefix(s.Name, "db "); ok {
			verbs = append(verbs, v)
		}
	}
	// Spans are exported as they end; statements end in the order sent.
	return verbs
}

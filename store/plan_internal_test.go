package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgtest"
)

// TestOneRecordStatementsProbeThePrimaryKey: the statements that act on one
// record by its scope (an owner's fenced write, the replay fast path's read)
// look it up by the primary key under both plan modes, on a table whose
// statistics say that no record is open. With a bare
// `status IN (...)` PostgreSQL planned the fenced write as a whole scan of
// the partial index idempotency_records_open (its statistics empty, its
// pages full of dead entries of records completed since the last vacuum):
// under load each write read all of them and took SSI locks on every page,
// and concurrent writes aborted each other.
func TestOneRecordStatementsProbeThePrimaryKey(t *testing.T) {
	s := planStore(t, `INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, expires_at)
		SELECT 'tenant', 'op', 'key-' || n, 'v2:x', 2, 'COMPLETED', 'COMPLETED', now() + INTERVAL '1 day'
		FROM generate_series(1, 5000) n`, `ANALYZE idempotency_records`)
	for _, tc := range []struct {
		name, params, sql, args string
	}{
		{"fenced write", "TEXT, TEXT, TEXT, INT8, TEXT",
			`UPDATE idempotency_records SET updated_at = now(), checkpoint = $5 WHERE ` + fenced, `'tenant', 'op', 'key-7', 1, 'X'`},
		{"settled read", "TEXT, TEXT, TEXT", settledRecordSQL, `'tenant', 'op', 'key-7'`},
	} {
		for mode, p := range plans(t, s, tc.params, tc.sql, tc.args) {
			if !strings.Contains(p, "Index Scan using idempotency_records_pkey") {
				t.Errorf("%s (%s) does not probe the primary key:\n%s", tc.name, mode, p)
			}
		}
	}
}

// planStore is a migrated store on a new database, after the statements
// of setup.
func planStore(t *testing.T, setup ...string) *Store {
	t.Helper()
	return migratedStore(t, pgtest.NewDatabase(t), setup...)
}

// migratedStore is planStore on the database at url.
func migratedStore(t *testing.T, url string, setup ...string) *Store {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sql := range setup {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// plans is what PostgreSQL plans for sql, prepared with the parameter
// types params ("" for none) and executed with args ("" for none), under
// each plan mode: plan_cache_mode to the EXPLAIN's lines.
func plans(t *testing.T, s *Store, params, sql, args string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if params != "" {
		params = "(" + params + ")"
	}
	if args != "" {
		args = "(" + args + ")"
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE plan %s AS %s", params, sql)); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	// The connection goes back to the pool for the next call's PREPARE.
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE plan") }()
	out := map[string]string{}
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE plan "+args)
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		out[mode] = strings.Join(lines, "\n")
	}
	return out
}

// TestCleanupWalksOnlyItsRecords: each cleanup step reads the partial index
// of the records it acts on (migrations/0010_cleanup_by_answer.sql), under
// both plan modes, on a table where three tenths of the records are to be
// pruned and three tenths deleted (a share at which, for a bare LIMIT,
// PostgreSQL prefers a sequential scan that stops at the limit, which on a
// large table reads from its start every batch), beside live records with
// and without an answer:
// pruning never walks past records that keep no answer (a week of
// referencing records, as a payments node leaves them), and deleting never
// walks past records that keep one.
func TestCleanupWalksOnlyItsRecords(t *testing.T) {
	s := planStore(t, `INSERT INTO idempotency_records
		(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
		 response_status, response_body, response_by_reference, resource_type, resource_id, created_at, expires_at)
		SELECT 'tenant', 'op', 'key-' || n, 'v2:x', 2, 'COMPLETED', 'COMPLETED', 201,
			CASE WHEN n % 10 IN (0, 2, 3, 4, 5, 6, 7) THEN '\x7b7d'::BYTEA END, n % 10 NOT IN (0, 2, 3, 4, 5, 6, 7), 'thing', 'x' || n,
			now() - INTERVAL '3 days',
			CASE WHEN n % 10 IN (0, 6, 7) THEN now() - INTERVAL '2 hours' WHEN n % 10 IN (1, 8, 9) THEN now() - INTERVAL '2 days'
				ELSE now() + INTERVAL '1 day' END
		FROM generate_series(1, 20000) n`, `ANALYZE idempotency_records`)
	for _, tc := range []struct {
		name, sql, index string
	}{
		{"prune", pruneBodiesSQL, "idempotency_records_to_prune"},
		{"delete", deleteExpiredSQL, "idempotency_records_to_delete"},
	} {
		for mode, p := range plans(t, s, "INT8, INT8", tc.sql, "3600000, 500") {
			// An index scan ("Index Scan using") or a bitmap scan of it
			// ("Bitmap Index Scan on"): either reads only its entries.
			if !strings.Contains(p, "Index Scan using "+tc.index) && !strings.Contains(p, "Index Scan on "+tc.index) {
				t.Errorf("%s (%s) does not read %s:\n%s", tc.name, mode, tc.index, p)
			}
		}
	}
}

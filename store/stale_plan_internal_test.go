package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgtest"
)

// TestOpenRecordPollsWalkTheStaleIndex: the recovery poll (StaleRecords) and
// the in-progress age gauge walk idempotency_records_stale in order, under
// both plan modes, on a table full of records settled since its last vacuum.
// Their earlier queries were planned as bitmap scans of
// idempotency_records_open, which visit the heap page of every entry and mark
// none dead: each poll read every record settled since the last vacuum (424
// ms per poll with 450,000 records in a soak), and the table's growth
// slowed every node down.
func TestOpenRecordPollsWalkTheStaleIndex(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.NewDatabase(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Records claimed, then settled: every one leaves a dead entry in the
	// indexes of open records until a vacuum.
	for _, sql := range []string{
		`INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, locked_until, expires_at)
		SELECT 'tenant', 'op', 'key-' || n, 'v2:x', 2, 'IN_PROGRESS', 'RECEIVED', now() + INTERVAL '30 seconds', now() + INTERVAL '1 day'
		FROM generate_series(1, 20000) n`,
		`UPDATE idempotency_records SET status = 'COMPLETED', checkpoint = 'COMPLETED', locked_until = NULL
		WHERE idempotency_key <> 'key-7'`,
		// As autovacuum's ANALYZE finds it: hardly a record open.
		`ANALYZE idempotency_records`,
	} {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for i, tc := range []struct {
		name, params, sql, args string
	}{
		{"stale records", "TEXT, INT8", staleRecordsSQL, `'op', 50`},
		{"in-progress age", "", inProgressAgeSQL, ""},
	} {
		params := ""
		if tc.params != "" {
			params = "(" + tc.params + ")"
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE poll%d %s AS %s", i, params, tc.sql)); err != nil {
			t.Fatalf("%s: prepare: %v", tc.name, err)
		}
		args := ""
		if tc.args != "" {
			args = "(" + tc.args + ")"
		}
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN EXECUTE poll%d %s", i, args))
			if err != nil {
				t.Fatalf("%s: explain: %v", tc.name, err)
			}
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			p := strings.Join(plan, "\n")
			if !strings.Contains(p, "Index Scan using idempotency_records_stale") || strings.Contains(p, "Bitmap") {
				t.Errorf("%s (%s) does not walk idempotency_records_stale in order:\n%s", tc.name, mode, p)
			}
		}
	}
	// And they still answer: key-7 is open, its lock not yet expired.
	if recs, err := StaleRecords(ctx, s.pool, "op", 10); err != nil || len(recs) != 0 {
		t.Errorf("StaleRecords = %d records, %v; want none (key-7 is locked)", len(recs), err)
	}
	if age, err := InProgressAgeMax(ctx, s.pool); err != nil || age < 0 {
		t.Errorf("InProgressAgeMax = %v, %v", age, err)
	}
}

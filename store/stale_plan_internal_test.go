package store

import (
	"context"
	"strings"
	"testing"
)

// TestOpenRecordPollsWalkTheStaleIndex: the recovery poll (staleRecords) and
// the in-progress age gauge walk idempotency_records_stale in order, under
// both plan modes, on a table full of records settled since its last vacuum.
// Their earlier queries were planned as bitmap scans of
// idempotency_records_open, which visit the heap page of every entry and mark
// none dead: each poll read every record settled since the last vacuum (424
// ms per poll with 450,000 records in a soak), and the table's growth
// slowed every node down.
func TestOpenRecordPollsWalkTheStaleIndex(t *testing.T) {
	// Records claimed, then settled: every one leaves a dead entry in the
	// indexes of open records until a vacuum.
	s := planStore(t,
		`INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, locked_until, expires_at)
		SELECT 'tenant', 'op', 'key-' || n, 'v2:x', 2, 'IN_PROGRESS', 'RECEIVED', now() + INTERVAL '30 seconds', now() + INTERVAL '1 day'
		FROM generate_series(1, 20000) n`,
		`UPDATE idempotency_records SET status = 'COMPLETED', checkpoint = 'COMPLETED', locked_until = NULL
		WHERE idempotency_key <> 'key-7'`,
		// As autovacuum's ANALYZE finds it: hardly a record open.
		`ANALYZE idempotency_records`,
	)
	for _, tc := range []struct {
		name, params, sql, args string
	}{
		{"stale records", "TEXT, INT8", staleRecordsSQL, `'op', 50`},
		{"in-progress age", "", inProgressAgeSQL, ""},
	} {
		for mode, p := range plans(t, s, tc.params, tc.sql, tc.args) {
			if !strings.Contains(p, "Index Scan using idempotency_records_stale") || strings.Contains(p, "Bitmap") {
				t.Errorf("%s (%s) does not walk idempotency_records_stale in order:\n%s", tc.name, mode, p)
			}
		}
	}
	ctx := context.Background()
	// And they still answer: key-7 is open, its lock not yet expired.
	if recs, err := staleRecords(ctx, s.pool, "op", 10); err != nil || len(recs) != 0 {
		t.Errorf("staleRecords = %d records, %v; want none (key-7 is locked)", len(recs), err)
	}
	if age, err := InProgressAgeMax(ctx, s.pool); err != nil || age < 0 {
		t.Errorf("InProgressAgeMax = %v, %v", age, err)
	}
}

package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
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

// TestStuckRecordListsWalkTheStaleIndex: listing the records of a stuck
// status (records list --status UNKNOWN_REQUIRES_RECOVERY, the runbooks'
// first step) reads the open records' index, not every record: on a table
// of settled records, under both plan modes.
func TestStuckRecordListsWalkTheStaleIndex(t *testing.T) {
	s := planStore(t,
		`INSERT INTO idempotency_records
			(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, expires_at)
		SELECT 'tenant-' || (n % 50), 'op', 'key-' || n, 'v2:x', 2, 'COMPLETED', 'COMPLETED', now() + INTERVAL '1 day'
		FROM generate_series(1, 20000) n`,
		`UPDATE idempotency_records SET status = 'UNKNOWN_REQUIRES_RECOVERY', checkpoint = 'STARTED' WHERE idempotency_key = 'key-7'`,
		`ANALYZE idempotency_records`,
	)
	for _, status := range []idem.Status{idem.StatusUnknown, idem.StatusInProgress} {
		sql, args, _, err := listSQL(RecordFilter{Status: status})
		if err != nil {
			t.Fatal(err)
		}
		if len(args) != 2 {
			t.Fatalf("listSQL args = %v", args)
		}
		for mode, p := range plans(t, s, "TEXT, INT8", sql, fmt.Sprintf("'%s', %d", status, args[1])) {
			if !strings.Contains(p, "idempotency_records_stale") {
				t.Errorf("list --status %s (%s) does not read idempotency_records_stale:\n%s", status, mode, p)
			}
		}
	}
	page, err := s.ListRecords(context.Background(), RecordFilter{Status: idem.StatusUnknown})
	if err != nil || len(page.Records) != 1 || page.Records[0].Record.Key != "key-7" {
		t.Errorf("ListRecords(UNKNOWN) = %+v, %v; want key-7 alone", page, err)
	}
}

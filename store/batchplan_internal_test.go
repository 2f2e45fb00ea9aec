package store

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
)

// TestBatchPlansProbeThePrimaryKeyOnAnEmptyTable: the generic plan a batch
// statement gets under batchPlan, made while the records table is empty (as
// a node's first batches are), probes the primary key for each row. Without
// enable_seqscan off PostgreSQL planned the completion batch as a
// sequential scan and hash join there, and a generic plan is kept for the
// connection's life: it would have gone on scanning the table as it grew.
func TestBatchPlansProbeThePrimaryKeyOnAnEmptyTable(t *testing.T) {
	s := planStore(t)
	for _, tc := range []struct{ name, sql string }{
		{"claims", claimBatchSQL},
		{"checkpoints", checkpointBatchSQL},
		{"completions", completeBatchSQL},
	} {
		p := batchGenericPlan(t, s, tc.sql)
		if !strings.Contains(p, "Index Scan using idempotency_records_pkey") || strings.Contains(p, "Seq Scan on idempotency_records") {
			t.Errorf("%s batch does not probe the primary key:\n%s", tc.name, p)
		}
	}
}

// batchGenericPlan is the plan of sql after batchPlan in a transaction
// (rolled back), with every parameter NULL: the generic plan, whatever
// the values.
func batchGenericPlan(t *testing.T, s *Store, sql string) string {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(sql, -1) {
		var i int
		fmt.Sscan(m[1], &i)
		n = max(n, i)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// PREPARE outlives the transaction.
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE batch") }()
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{batchPlan, "PREPARE batch AS " + sql} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE batch("+strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")+")")
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestBatchStatementsArePlannedOnce: batches of claims and completions of
// every size run on the generic plan of their statement, never on a
// custom plan made for the batch (see batchPlan). Statements are prepared
// on a direct connection only: behind a transaction pooler the store sends
// each unnamed, planned where it is bound.
func TestBatchStatementsArePlannedOnce(t *testing.T) {
	ctx := context.Background()
	s := migratedStore(t, pgtest.NewDirectDatabase(t))
	for round := range 8 {
		// Batches of 2 to 9 claims, then their completions.
		size := 2 + round
		leases := make([]idem.Lease, size)
		held := s.claims.hold()
		var wg sync.WaitGroup
		errs := make([]error, size)
		for i := range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := s.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: "t", Operation: "op", Key: fmt.Sprintf("k-%d-%d", round, i)},
					RequestHashes: []string{"v2:x"}, HashVersion: 2, Owner: "o", LockFor: time.Minute, Window: time.Hour})
				leases[i], errs[i] = d.Lease, err
			}()
		}
		waitFor(t, func() bool { return s.claims.queued() == size })
		held()
		wg.Wait()
		held = s.completions.hold()
		for i := range size {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Complete(ctx, leases[i], idem.Completion{Response: idem.Response{Status: 200, Body: []byte(`{}`)}})
			}()
		}
		waitFor(t, func() bool { return s.completions.queued() == size })
		held()
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	plans := map[string][2]int64{}
	conns := s.pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		rows, err := c.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var (
				sql       string
				gen, cust int64
			)
			if err := rows.Scan(&sql, &gen, &cust); err != nil {
				t.Fatal(err)
			}
			p := plans[sql]
			plans[sql] = [2]int64{p[0] + gen, p[1] + cust}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	for name, sql := range map[string]string{"claims": claimBatchSQL, "completions": completeBatchSQL} {
		p, ok := plans[sql]
		switch {
		case !ok:
			t.Errorf("the %s batch statement is not prepared on any connection", name)
		case p[0] < 8 || p[1] != 0:
			t.Errorf("the %s batch statement ran on %d generic and %d custom plans; want 8 or more batches, all generic", name, p[0], p[1])
		}
	}
}

// waitFor waits until cond holds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

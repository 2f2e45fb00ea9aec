package store

import (
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestAmbiguousResult: how a transaction's end is classified. A commit
// (COMMIT, or crdb's RELEASE SAVEPOINT cockroach_restart) that was not
// answered or was answered 40003 ("result is ambiguous", CockroachDB's
// answer when it cannot tell), and a 40003 from any statement, leave the
// outcome unknown; a 40001 at RELEASE (crdb retries from the savepoint)
// and every other server answer are definite.
func TestAmbiguousResult(t *testing.T) {
	lost := fmt.Errorf("read: %w", io.ErrUnexpectedEOF)
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "deliberate"} }
	for _, tc := range []struct {
		name    string
		keeper  commitKeeper
		err     error
		unknown bool
	}{
		{"COMMIT answered 40003", commitKeeper{commitErr: pg("40003")}, pg("40003"), true},
		{"COMMIT unanswered", commitKeeper{commitErr: lost}, lost, true},
		{"COMMIT answered 40001", commitKeeper{commitErr: pg("40001")}, pg("40001"), false},
		{"COMMIT rolled back", commitKeeper{commitErr: pgx.ErrTxCommitRollback}, pgx.ErrTxCommitRollback, false},
		{"RELEASE answered 40003", commitKeeper{releaseErr: pg("40003")}, pg("40003"), true},
		{"RELEASE unanswered", commitKeeper{releaseErr: lost}, lost, true},
		{"RELEASE answered 40001 until crdb gave up", commitKeeper{releaseErr: pg("40001")}, pg("40001"), false},
		{"a statement answered 40003", commitKeeper{}, fmt.Errorf("claim: %w", pg("40003")), true},
		{"a statement rejected", commitKeeper{}, pg("23505"), false},
		{"a statement unanswered (nothing committed yet)", commitKeeper{}, lost, false},
	} {
		if got := tc.keeper.unknown(tc.err) != nil; got != tc.unknown {
			t.Errorf("%s: unknown = %v, want %v", tc.name, got, tc.unknown)
		}
	}
	if retryable(pg("40003")) || !retryable(pg("40001")) {
		t.Error("40003 must never be retried as if nothing happened, 40001 always")
	}
	if !isUnavailable(fmt.Errorf("read: %w", pg("40003"))) {
		t.Error("a read answered 40003 is the store unable to answer: STORE_UNAVAILABLE")
	}
}

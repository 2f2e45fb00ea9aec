package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// statements are the store statements fn sent (storetest.Statements).
var statements = storetest.Statements

// TestRoundTrips pins the statements of the hot path on PostgreSQL: a
// fresh key's claim is one statement (the plain insert while few claims
// find their key taken; the insert that also reads a settled record once
// more than a tenth do), a replay of a settled key is the plain insert and
// a transaction that reads the record while they are few, that same one
// statement once they are many, a checkpoint or a completion is its update
// alone (each an implicit transaction), and a transaction is BEGIN, its
// statements and COMMIT, without CockroachDB's savepoint.
func TestRoundTrips(t *testing.T) {
	st, _ := storetest.New(t)
	var d idem.Decision
	replay := func(ctx context.Context) error {
		r, err := st.Begin(ctx, beginReq("rt-1", "v1:a"))
		if err == nil && r.Outcome != idem.OutcomeReplay {
			err = errors.New("not a replay: " + r.Outcome.String())
		}
		return err
	}
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) error
		want []string
	}{
		{"claim of a fresh key", func(ctx context.Context) (err error) {
			d, err = st.Begin(ctx, beginReq("rt-1", "v1:a"))
			return err
		}, []string{"INSERT"}},
		{"checkpoint", func(ctx context.Context) error { return st.Checkpoint(ctx, d.Lease, cpCreated) }, []string{"UPDATE"}},
		{"completion", func(ctx context.Context) error { return st.Complete(ctx, d.Lease, completion(`{"ok":1}`)) }, []string{"UPDATE"}},
		{"replay while retries are rare", replay, []string{"INSERT", "BEGIN", "SELECT", "COMMIT"}},
		{"replays until more than a tenth of claims found their key taken", func(ctx context.Context) error {
			for range 6 {
				if err := replay(ctx); err != nil {
					return err
				}
			}
			return nil
		}, slices.Repeat([]string{"INSERT", "BEGIN", "SELECT", "COMMIT"}, 6)},
		{"replay once retries are many", replay, []string{"WITH"}},
		{"claim of a fresh key once retries are many", func(ctx context.Context) error {
			_, err := st.Begin(ctx, beginReq("rt-2", "v1:a"))
			return err
		}, []string{"WITH"}},
		{"transaction", func(ctx context.Context) error {
			return st.ExecTx(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT 1")
				return err
			})
		}, []string{"BEGIN", "SELECT", "COMMIT"}},
	} {
		var err error
		got := statements(t, func(ctx context.Context) { err = tc.fn(ctx) })
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s sent %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestExecTxSwallowedErrorIsDefinite: a transaction whose function
// swallowed a statement's error is rolled back by the server at COMMIT;
// that is an answer, not a commit of unknown outcome.
func TestExecTxSwallowedErrorIsDefinite(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	err := st.ExecTx(ctx, func(tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, "SELECT * FROM no_such_table")
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, store.ErrCommitUnknown) {
		t.Fatalf("ExecTx = %v, want ErrTxCommitRollback, not ErrCommitUnknown", err)
	}
}

// TestStartAt: a claim that asks for it inserts its record at the given
// checkpoint (the engine's STARTED, saving the write before Execute);
// without it the record starts at RECEIVED, and COMPLETED is refused.
func TestStartAt(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	req := beginReq("sa-1", "v1:a")
	req.StartAt = "STARTED"
	d, err := st.Begin(ctx, req)
	if err != nil || d.Outcome != idem.OutcomeExecute || d.Record.Checkpoint != "STARTED" {
		t.Fatalf("Begin with StartAt = %v, %v, %+v", d.Outcome, err, d.Record)
	}
	if rec, err := st.Get(ctx, req.Scope); err != nil || rec.Checkpoint != "STARTED" {
		t.Errorf("stored record %+v, %v; want it at STARTED", rec, err)
	}
	plain, err := st.Begin(ctx, beginReq("sa-2", "v1:a"))
	if err != nil || plain.Record.Checkpoint != idem.CheckpointReceived {
		t.Errorf("Begin without StartAt = %+v, %v; want RECEIVED", plain.Record, err)
	}
	bad := beginReq("sa-3", "v1:a")
	bad.StartAt = idem.CheckpointCompleted
	if _, err := st.Begin(ctx, bad); idem.ErrorCode(err) != idem.ECodeValidationFailed {
		t.Errorf("StartAt COMPLETED = %v, want %s", err, idem.ECodeValidationFailed)
	}
}

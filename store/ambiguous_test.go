package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// raiseAmbiguous is a statement the server answers with SQLSTATE 40003, as
// CockroachDB answers one whose result it cannot tell.
const raiseAmbiguous = `DO $$BEGIN RAISE EXCEPTION 'result is ambiguous' USING ERRCODE = '40003'; END$$`

// TestAmbiguousResultIsCommitUnknown: a statement the server answers 40003
// ("result is ambiguous", which CockroachDB sends also for an implicit
// transaction) is an unknown commit outcome, reported as ErrCommitUnknown
// in a STORE_UNAVAILABLE error and run once, never retried as if nothing
// had happened: through ExecOne, and in ExecTx on either server's path.
// (A commit answered 40003 or unanswered needs a proxy: tests/ambiguous.)
func TestAmbiguousResultIsCommitUnknown(t *testing.T) {
	_, url := storetest.New(t)
	ctx := context.Background()
	for _, server := range []store.Server{store.ServerPostgres, store.ServerCockroach} {
		st, err := store.Open(ctx, url, store.Options{Server: server})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		check := func(what string, runs int, err error) {
			t.Helper()
			if !errors.Is(err, store.ErrCommitUnknown) || idem.ErrorCode(err) != idem.ECodeStoreUnavailable {
				t.Errorf("%s, %s: err = %v, want ErrCommitUnknown as STORE_UNAVAILABLE", server, what, err)
			}
			if runs != 1 {
				t.Errorf("%s, %s: ran %d times, want once", server, what, runs)
			}
		}
		runs := 0
		err = st.ExecOne(ctx, func(q store.Querier) error {
			runs++
			_, err := q.Exec(ctx, raiseAmbiguous)
			return err
		})
		check("ExecOne", runs, err)
		runs = 0
		err = st.ExecTx(ctx, func(tx pgx.Tx) error {
			runs++
			_, err := tx.Exec(ctx, raiseAmbiguous)
			return err
		})
		check("ExecTx", runs, err)
		// A read answered 40003 could not be answered: STORE_UNAVAILABLE.
		err = st.Read(ctx, func(q store.Querier) error {
			_, err := q.Exec(ctx, raiseAmbiguous)
			return err
		})
		if idem.ErrorCode(err) != idem.ECodeStoreUnavailable {
			t.Errorf("%s, Read: err = %v, want STORE_UNAVAILABLE", server, err)
		}
	}
}

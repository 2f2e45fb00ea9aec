package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// TestExecTxContendedIsUnavailable: a transaction that loses a
// serialization conflict at every one of its TxAttempts is rolled back and
// answered STORE_UNAVAILABLE (retry with the same key), not an internal
// error; the last conflict stays in the chain.
func TestExecTxContendedIsUnavailable(t *testing.T) {
	_, url := storetest.New(t)
	st, err := store.Open(context.Background(), url, store.Options{TxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, code := range []string{"40001", "40P01"} {
		attempts := 0
		err := st.ExecTx(context.Background(), func(tx pgx.Tx) error {
			attempts++
			if _, err := tx.Exec(context.Background(), "SELECT 1"); err != nil {
				return err
			}
			// This transaction is made to lose every conflict.
			return &pgconn.PgError{Code: code, Message: "deliberate"}
		})
		var pgErr *pgconn.PgError
		if got := idem.ErrorCode(err); got != idem.ECodeStoreUnavailable || !errors.As(err, &pgErr) || pgErr.Code != code {
			t.Errorf("%s at every attempt: code %q, err %v; want %s wrapping the %s", code, got, err, idem.ECodeStoreUnavailable, code)
		}
		// crdbpgx may also retry inside an attempt (a savepoint rollback).
		if attempts < 3 {
			t.Errorf("%s: fn ran %d times, want at least TxAttempts (3)", code, attempts)
		}
	}
	// Another statement error is still returned as it is.
	err = st.ExecTx(context.Background(), func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), "SELECT * FROM no_such_table")
		return err
	})
	if code := idem.ErrorCode(err); code == idem.ECodeStoreUnavailable {
		t.Errorf("a missing table: code %q (%v), want the statement error itself", code, err)
	}
}

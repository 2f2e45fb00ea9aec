package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/storetest"
)

// TestTransactionIsolation: ExecTx runs SERIALIZABLE, ExecTxReadCommitted
// READ COMMITTED (on PostgreSQL), whatever the session's default.
func TestTransactionIsolation(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	for name, exec := range map[string]func(context.Context, func(pgx.Tx) error) error{
		"serializable":   st.ExecTx,
		"read committed": st.ExecTxReadCommitted,
	} {
		var got string
		if err := exec(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got)
		}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != name {
			t.Errorf("transaction_isolation = %q, want %q", got, name)
		}
	}
}

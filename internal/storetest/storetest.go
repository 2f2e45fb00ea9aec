// Package storetest opens a migrated store on a fresh throwaway database, for
// tests. The test binary's TestMain must call pgtest.Main.
package storetest

import (
	"context"
	"testing"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// New returns a store on a new empty database, migrated for the engine and
// the payments operation (payments.Migrate), and its URL. The store
// is closed in t.Cleanup.
func New(tb testing.TB) (*store.Store, string) {
	tb.Helper()
	url := pgtest.NewDatabase(tb)
	st, err := store.Open(context.Background(), url, store.Options{MaxConns: 64})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(st.Close)
	if err := payments.Migrate(context.Background(), st); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	return st, url
}

// Count returns the result of a SELECT count(*) query.
func Count(tb testing.TB, st *store.Store, query string, args ...any) int {
	tb.Helper()
	var n int
	if err := st.Pool().QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// Exec runs a statement (test setup such as making a record stale).
func Exec(tb testing.TB, st *store.Store, query string, args ...any) {
	tb.Helper()
	if _, err := st.Pool().Exec(context.Background(), query, args...); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
}

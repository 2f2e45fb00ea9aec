package store

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem"
)

// TestFastPathFallsThroughOnSerializationFailure: a replay read chosen as a
// serialization victim (40001) or caught in a deadlock (40P01) leaves the
// decision to the claim, whose transaction retries, instead of answering
// 500; any other failure is still reported.
func TestFastPathFallsThroughOnSerializationFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: codeSerializationFailure}, true},
		{fmt.Errorf("query: %w", &pgconn.PgError{Code: codeDeadlock}), true},
		{&pgconn.PgError{Code: "42P01"}, false},
		{errors.New("connection reset"), false},
	} {
		if got := fallThrough(tc.err); got != tc.want {
			t.Errorf("fallThrough(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestInsufficientResourcesAreUnavailable: a store out of (shared) memory,
// disk or connections (class 53, such as PostgreSQL's "out of shared memory"
// when its predicate lock table is full) answers 503 STORE_UNAVAILABLE,
// which a client retries with the same key, not 500 INTERNAL; a statement
// the store rejects is still not unavailability.
func TestInsufficientResourcesAreUnavailable(t *testing.T) {
	for code, want := range map[string]bool{"53200": true, "53100": true, "53300": true, "53400": true, "08006": true, "42P01": false, "23505": false} {
		err := fmt.Errorf("read settled record: %w", &pgconn.PgError{Code: code})
		if got := isUnavailable(err); got != want {
			t.Errorf("isUnavailable(%s) = %v, want %v", code, got, want)
		}
		var e *idem.Error
		if got := errors.As(Classify(err), &e) && e.Code == idem.ECodeStoreUnavailable; got != want {
			t.Errorf("Classify(%s) is STORE_UNAVAILABLE: %v, want %v", code, got, want)
		}
	}
}

package store

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
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

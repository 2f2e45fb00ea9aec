package store

import (
	"context"

	"github.com/idemcoord/idem"
)

// ListStale returns up to limit records of operation that nobody is working
// on (see staleRecords), oldest first. It lets a recovery worker of any
// operation find its records without knowing the store's tables.
func (s *Store) ListStale(ctx context.Context, operation string, limit int) ([]*idem.Record, error) {
	return staleRecords(ctx, s.pool, operation, limit)
}

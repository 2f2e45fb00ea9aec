package store

import (
	"context"
	"fmt"
	"time"
)

// The cleanup statements. Each reads the partial index of the records it
// acts on, in window order (migrations/0010_cleanup_by_answer.sql): a
// settled record that keeps an answer (body or headers) is in
// idempotency_records_to_prune, one with nothing to drop (it renders its
// answer from the resource it references, or its answer was dropped) in
// idempotency_records_to_delete. Their WHERE clauses repeat the indexes'
// predicates so that the planner can use them, and each takes the oldest
// first (ORDER BY expires_at, the index's order): with a bare LIMIT,
// PostgreSQL, estimating many more such records than there were (79,277
// against 4,500 beside 10^7 records), chose a sequential scan that stops
// at the limit, and each batch read the table from its start until it
// found enough (133 records pruned per second, docs/benchmarks-history.md).
const (
	pruneBodiesSQL = `UPDATE idempotency_records SET response_body = NULL, response_headers = NULL,
			status = 'EXPIRED', updated_at = now()
		WHERE (tenant_id, operation_name, idempotency_key) IN (
			SELECT tenant_id, operation_name, idempotency_key FROM idempotency_records
			WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE')
			  AND (response_body IS NOT NULL OR response_headers IS NOT NULL)
			  AND expires_at <= now() AND created_at <= now() - $1::INT8 * INTERVAL '1 millisecond'
			ORDER BY expires_at LIMIT $2)`
	deleteExpiredSQL = `DELETE FROM idempotency_records
		WHERE (tenant_id, operation_name, idempotency_key) IN (
			SELECT tenant_id, operation_name, idempotency_key FROM idempotency_records
			WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE', 'EXPIRED')
			  AND response_body IS NULL AND response_headers IS NULL
			  AND expires_at <= now() - $1::INT8 * INTERVAL '1 millisecond'
			ORDER BY expires_at LIMIT $2)`
)

// PruneBodies drops the stored answer (body and headers) of up to limit
// settled records that are past their window and older than bodyRetention,
// and marks them EXPIRED. Their metadata (scope, request hash, resource,
// timestamps) stays for diagnostics until DeleteExpired removes it. A
// record that keeps no answer (one that references its resource) is left
// as it is: a settled record past its window is a new operation to a retry
// whatever its status (idem.Decide), and rewriting it would drop nothing.
// Records still IN_PROGRESS or UNKNOWN_REQUIRES_RECOVERY are never
// touched. It returns how many records it pruned.
func PruneBodies(ctx context.Context, q Querier, bodyRetention time.Duration, limit int) (int, error) {
	tag, err := q.Exec(ctx, pruneBodiesSQL, bodyRetention.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("store: prune bodies: %w", Classify(err))
	}
	return int(tag.RowsAffected()), nil
}

// DeleteExpired deletes up to limit settled records that keep no answer
// (pruned, or referencing their resource) whose window ended more than
// metadataRetention ago. A record that still keeps its answer is pruned
// first. Records still IN_PROGRESS or UNKNOWN_REQUIRES_RECOVERY are never
// deleted. It returns how many it deleted.
func DeleteExpired(ctx context.Context, q Querier, metadataRetention time.Duration, limit int) (int, error) {
	tag, err := q.Exec(ctx, deleteExpiredSQL, metadataRetention.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("store: delete expired records: %w", Classify(err))
	}
	return int(tag.RowsAffected()), nil
}

// CleanupConfig bounds one cleanup pass.
type CleanupConfig struct {
	// BodyRetention: response bodies are dropped this long after a record's
	// creation, once it is past its window.
	BodyRetention time.Duration
	// MetadataRetention: expired metadata is deleted this long after the
	// window ends.
	MetadataRetention time.Duration
	// BatchSize bounds every statement. Default 500.
	BatchSize int
	// Pause is slept between batches so cleanup never competes with traffic
	// for long. Default 50ms.
	Pause time.Duration
}

// CleanupResult counts what a pass did.
type CleanupResult struct {
	BodiesPruned   int
	RecordsDeleted int
	Batches        int
}

// Cleanup runs batches of PruneBodies then DeleteExpired until a batch comes
// back short, pausing between batches.
func (s *Store) Cleanup(ctx context.Context, cfg CleanupConfig) (CleanupResult, error) {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.Pause <= 0 {
		cfg.Pause = 50 * time.Millisecond
	}
	var res CleanupResult
	for _, step := range []struct {
		run   func() (int, error)
		count *int
	}{
		{func() (int, error) { return PruneBodies(ctx, serialPool{s.pool}, cfg.BodyRetention, cfg.BatchSize) }, &res.BodiesPruned},
		{func() (int, error) {
			return DeleteExpired(ctx, serialPool{s.pool}, cfg.MetadataRetention, cfg.BatchSize)
		}, &res.RecordsDeleted},
	} {
		for {
			n, err := step.run()
			if err != nil {
				return res, err
			}
			res.Batches++
			*step.count += n
			if n < cfg.BatchSize {
				break
			}
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(cfg.Pause):
			}
		}
	}
	return res, nil
}

-- Cleanup rewrites only the records that keep an answer to drop. Before,
-- every settled record past its window was rewritten once to drop its
-- answer and mark it EXPIRED, and deleted a week later: a record that
-- references its resource (a payment's) has no body or headers to drop, so
-- its rewrite dropped nothing and cost a new tuple and its index entries,
-- scattered over a table that no longer fits in memory
-- (docs/benchmarks.md, "Cleanup that rewrites only what it drops"). Now
-- each settled record sits in exactly one of these, as it sat in one of the
-- two indexes they replace:
--   idempotency_records_to_prune: it keeps an answer; PruneBodies drops it
--     once past the window and the body retention (the record moves to the
--     other index);
--   idempotency_records_to_delete: nothing to drop (none kept, or dropped);
--     DeleteExpired deletes it once past the window and the metadata
--     retention. A settled record past its window is a new operation to a
--     retry whatever its status (idem.Decide), so it needs no EXPIRED mark.
--
-- On a large table, build them beforehand without blocking writes
-- (PostgreSQL: CREATE INDEX CONCURRENTLY ... with the same definitions);
-- IF NOT EXISTS then makes this migration skip them.
CREATE INDEX IF NOT EXISTS idempotency_records_to_prune ON idempotency_records (expires_at)
    WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE')
      AND (response_body IS NOT NULL OR response_headers IS NOT NULL);
CREATE INDEX IF NOT EXISTS idempotency_records_to_delete ON idempotency_records (expires_at)
    WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE', 'EXPIRED')
      AND response_body IS NULL AND response_headers IS NULL;
DROP INDEX IF EXISTS idempotency_records_prunable;
DROP INDEX IF EXISTS idempotency_records_expired;

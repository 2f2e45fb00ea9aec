-- Each cleanup step walks an index of only the rows it acts on. With one
-- index on expires_at for every record, a batch dropping bodies first walked
-- past every record already EXPIRED (idemd keeps a week of that metadata):
-- 442 ms per batch of 500 with 10^6 such records, 0.16 ms with these
-- (docs/benchmarks.md, "Scale and cleanup").
--
-- On a large table, build them beforehand without blocking writes
-- (PostgreSQL: CREATE INDEX CONCURRENTLY ... with the same definitions);
-- IF NOT EXISTS then makes this migration skip them.
CREATE INDEX IF NOT EXISTS idempotency_records_prunable ON idempotency_records (expires_at)
    WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE');
CREATE INDEX IF NOT EXISTS idempotency_records_expired ON idempotency_records (expires_at)
    WHERE status = 'EXPIRED';
DROP INDEX IF EXISTS idempotency_records_expires_at;

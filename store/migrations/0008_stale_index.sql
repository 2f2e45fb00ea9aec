-- The open records in the order the recovery poll (StaleRecords) and the
-- in-progress age gauge (InProgressAgeMax) read them: oldest first. It
-- replaces idempotency_records_open, an index of the same records (and the
-- retryable ones) by locked_until, which nothing else reads: over it
-- PostgreSQL planned both as bitmap scans, which visit the heap page of every
-- entry and mark none dead, so each poll read every record settled since the
-- table's last vacuum (a vacuum comes once a fifth of the table has changed):
-- 424 ms per poll with 450,000 records, and the larger the table the slower
-- every node. An ordered index scan marks the entries of settled records dead
-- as it passes them, so its cost follows the open records, not the table
-- (docs/chaos.md, "Soak").
--
-- On a large table, build it beforehand without blocking writes
-- (PostgreSQL: CREATE INDEX CONCURRENTLY ... with the same definition);
-- IF NOT EXISTS then makes this migration skip it.
CREATE INDEX IF NOT EXISTS idempotency_records_stale ON idempotency_records (created_at)
    WHERE status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY');
DROP INDEX IF EXISTS idempotency_records_open;

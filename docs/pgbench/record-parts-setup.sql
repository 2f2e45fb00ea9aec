-- The tables of claim-key-only.sql, claim-record-pk.sql and
-- claim-record-to-delete.sql: the record's parts, each in a table of its
-- own (measurements of what the record's row costs; the product keeps its
-- records in idempotency_records). Run once in the benchmark's database,
-- after the migrations.
CREATE TABLE IF NOT EXISTS rec_keyonly (tenant_id TEXT, operation_name TEXT, idempotency_key TEXT,
    PRIMARY KEY (tenant_id, operation_name, idempotency_key));
CREATE TABLE IF NOT EXISTS rec_pk (LIKE idempotency_records INCLUDING DEFAULTS,
    PRIMARY KEY (tenant_id, operation_name, idempotency_key));
CREATE TABLE IF NOT EXISTS rec_del (LIKE idempotency_records INCLUDING DEFAULTS,
    PRIMARY KEY (tenant_id, operation_name, idempotency_key));
CREATE INDEX IF NOT EXISTS rec_del_to_delete ON rec_del (expires_at)
    WHERE status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE', 'EXPIRED')
      AND response_body IS NULL AND response_headers IS NULL;

-- The table of claim-in-row.sql: the payments table with the record's
-- columns in the payment's own row (a measurement of a record that shares
-- the operation's row; the product keeps records in idempotency_records).
-- Run once in the benchmark's database, after the migrations.
CREATE TABLE IF NOT EXISTS payments_keyed (
    LIKE payments INCLUDING ALL,
    operation_name          TEXT        NOT NULL,
    idempotency_key         TEXT        NOT NULL,
    request_hash            TEXT        NOT NULL,
    hash_version            INT         NOT NULL,
    record_status           TEXT        NOT NULL,
    checkpoint              TEXT        NOT NULL,
    owner                   TEXT        NOT NULL DEFAULT '',
    fencing_token           BIGINT      NOT NULL DEFAULT 1,
    locked_until            TIMESTAMPTZ,
    home_region             TEXT        NOT NULL DEFAULT '',
    expires_at              TIMESTAMPTZ NOT NULL,
    response_status         INT,
    response_schema_version TEXT,
    raw_hash                TEXT,
    UNIQUE (tenant_id, operation_name, idempotency_key)
);
CREATE INDEX IF NOT EXISTS payments_keyed_expires_at ON payments_keyed (expires_at);

-- Idempotency records: the durable memory of each scoped operation.
-- Timestamps are always written from the store's clock (now()).
CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant_id               TEXT        NOT NULL,
    operation_name          TEXT        NOT NULL,
    idempotency_key         TEXT        NOT NULL,
    request_hash            TEXT        NOT NULL,
    hash_version            INT         NOT NULL,
    status                  TEXT        NOT NULL,
    checkpoint              TEXT        NOT NULL,
    owner                   TEXT        NOT NULL DEFAULT '',
    fencing_token           BIGINT      NOT NULL DEFAULT 1,
    locked_until            TIMESTAMPTZ,
    attempts                INT         NOT NULL DEFAULT 1,
    generation              INT         NOT NULL DEFAULT 0,
    response_status         INT,
    response_headers        JSONB,
    response_body           BYTEA,
    response_schema_version TEXT,
    resource_type           TEXT,
    resource_id             TEXT,
    error_code              TEXT,
    home_region             TEXT        NOT NULL DEFAULT '',
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at              TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, operation_name, idempotency_key)
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_records_open ON idempotency_records (locked_until)
    WHERE status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY', 'FAILED_RETRYABLE');

-- The reference domain: payments, and the transactional outbox.
CREATE TABLE IF NOT EXISTS payments (
    tenant_id          TEXT        NOT NULL,
    payment_id         TEXT        NOT NULL,
    account_id         TEXT        NOT NULL,
    amount_minor       BIGINT      NOT NULL,
    currency           TEXT        NOT NULL,
    merchant_reference TEXT        NOT NULL,
    channel            TEXT        NOT NULL,
    status             TEXT        NOT NULL,
    provider_key       TEXT        NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id),
    -- A business constraint that catches a duplicate sent with a fresh key.
    CONSTRAINT payments_merchant_reference_key UNIQUE (tenant_id, account_id, merchant_reference)
);

CREATE TABLE IF NOT EXISTS outbox_events (
    event_id      TEXT        NOT NULL PRIMARY KEY,
    tenant_id     TEXT        NOT NULL,
    aggregate_id  TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS outbox_events_unpublished ON outbox_events (created_at) WHERE published_at IS NULL;

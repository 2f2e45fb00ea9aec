-- Messaging: the durable queue the outbox publisher fans events out to, the
-- consumers' inbox, and the consumers' own durable effects (see package outbox).
-- Timestamps are always written from the store's clock (now()).

-- One row per delivery of an outbox event to one consumer. A message (an
-- outbox event id) may be delivered more than once, so message_id is not
-- unique here; consumers deduplicate through consumer_inbox.
CREATE TABLE IF NOT EXISTS queue_messages (
    delivery_id   UUID        NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    consumer_name TEXT        NOT NULL,
    message_id    TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    tenant_id     TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    enqueued_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at  TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS queue_messages_pending ON queue_messages (consumer_name, enqueued_at)
    WHERE processed_at IS NULL;

-- The inbox: at most one row per (consumer, message), written in the same
-- transaction as the consumer's durable effect. status is PROCESSED, or
-- REJECTED (with error_code) for a message its handler refused for good.
CREATE TABLE IF NOT EXISTS consumer_inbox (
    consumer_name TEXT        NOT NULL,
    message_id    TEXT        NOT NULL,
    status        TEXT        NOT NULL,
    processed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    error_code    TEXT,
    PRIMARY KEY (consumer_name, message_id)
);

-- The ledger consumer's effect: one entry per (entry type, payment).
CREATE TABLE IF NOT EXISTS ledger_entries (
    entry_id          TEXT        NOT NULL PRIMARY KEY,
    entry_type        TEXT        NOT NULL,
    source_payment_id TEXT        NOT NULL,
    source_event_id   TEXT        NOT NULL,
    tenant_id         TEXT        NOT NULL,
    account_id        TEXT        NOT NULL,
    amount            TEXT        NOT NULL,
    currency          TEXT        NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT ledger_entries_source_key UNIQUE (entry_type, source_payment_id)
);

-- The receipt-email consumer's effect: the email to send, persisted before
-- anything is sent. The sender claims a row (claimed_until), sends, then sets
-- sent_at.
CREATE TABLE IF NOT EXISTS email_notifications (
    dedupe_key    TEXT        NOT NULL PRIMARY KEY,
    tenant_id     TEXT        NOT NULL,
    payment_id    TEXT        NOT NULL,
    account_id    TEXT        NOT NULL,
    amount        TEXT        NOT NULL,
    currency      TEXT        NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_until TIMESTAMPTZ,
    sent_at       TIMESTAMPTZ,
    attempts      INT         NOT NULL DEFAULT 0,
    last_error    TEXT
);

CREATE INDEX IF NOT EXISTS email_notifications_unsent ON email_notifications (created_at)
    WHERE sent_at IS NULL;

-- The mail sink: one row per actual send. Deliberately without a unique
-- constraint, so that a double send shows as two rows.
CREATE TABLE IF NOT EXISTS sent_emails (
    send_id    UUID        NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    dedupe_key TEXT        NOT NULL,
    tenant_id  TEXT        NOT NULL,
    recipient  TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    body       TEXT        NOT NULL,
    sent_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS sent_emails_dedupe_key ON sent_emails (dedupe_key);

-- CockroachDB-only multi-region schema for IDEM_STORE_MODE=global.
--
-- What this is: the same tables, columns and constraints as store/migrations/
-- (the PostgreSQL/CockroachDB-common schema that `idemctl migrate` applies,
-- or idemd at start unless IDEM_MIGRATE=false),
-- plus the CockroachDB-only parts: database regions, the survival goal, row
-- localities and row-level TTL. deploy/cockroach/README.md explains every
-- choice at more length, with the latency each one costs.
--
-- How to apply: once, as the idem_migrator role (which owns the database and
-- the tables; the nodes' idem_app role only reads and writes rows; see
-- deploy/cockroach/README.md#apply), BEFORE the first idemd connects:
--
--   cockroach sql --url "$MIGRATOR_URL" -f deploy/cockroach/schema.sql
--
-- `cockroach sql -f` runs every statement in its own implicit transaction,
-- which is what schema changes on CockroachDB want: do not wrap this file in
-- BEGIN/COMMIT. The statements use IF NOT EXISTS where CockroachDB has it,
-- so running the file again after a partial failure is fine.
--
-- Why before idemd: idemd applies store/migrations at start with CREATE TABLE
-- IF NOT EXISTS. If it got there first, it would create plain tables (in the
-- primary region, no TTL) and the CREATE TABLE statements below would be
-- skipped. The end of this file records the engine's migration 1 and
-- payments' 2 and 3 as applied (each set keeps its own versions), so idemd
-- finds nothing to do for them. Later migrations (0004_...) are applied by
-- `idemctl migrate` as idem_migrator; review each one for locality (a new table defaults to
-- REGIONAL BY TABLE IN PRIMARY REGION) before it reaches production.
--
-- Region names must be exactly the `region=` tier of every CockroachDB node's
-- --locality flag AND the IDEM_REGION of the idemd nodes in that region.

CREATE DATABASE IF NOT EXISTS idem;

-- ---------------------------------------------------------------------------
-- Regions and survival goal
-- ---------------------------------------------------------------------------

-- The primary region holds tables that have no per-row home (schema_migrations)
-- and is the fallback home of a row whose region is unknown (see crdb_region
-- below). Pick the region in the middle of the others by latency.
ALTER DATABASE idem SET PRIMARY REGION "eu-west";
ALTER DATABASE idem ADD REGION IF NOT EXISTS "us-east";
ALTER DATABASE idem ADD REGION IF NOT EXISTS "ap-south";

-- SURVIVE REGION FAILURE: losing a whole region is the store's problem, not
-- the service's. Every range gets 5 voting replicas, at most 2 of them in its
-- home region, so a write commits only once a replica in ANOTHER region has
-- acknowledged it: every write pays at least one round trip to the nearest
-- other region. In exchange, when a region disappears its rows stay readable
-- and writable from the remaining regions (leases move; nothing acknowledged
-- is lost), which is exactly the guarantee a tenant's failover relies on: the
-- new home region sees every record the old one committed.
--
-- The alternative, SURVIVE ZONE FAILURE (the default), keeps all 3 voters of a
-- REGIONAL BY ROW row in its home region: writes by the home region commit
-- with a region-local quorum, but the loss of that region makes its rows
-- unavailable until it comes back. Needs at least 3 regions (we have 3).
ALTER DATABASE idem SURVIVE REGION FAILURE;

USE idem;

-- Not needed here, listed so nobody adds them "for speed":
--   * Do not lower isolation. idemd starts every transaction at SERIALIZABLE
--     itself (pgx TxOptions) and retries SQLSTATE 40001 through cockroach-go's
--     crdbpgx.ExecuteTx (savepoint protocol) plus a bounded restart loop in
--     store.ExecTx, so there is no cluster setting to change. On a cluster
--     dedicated to idem you may also refuse READ COMMITTED outright:
--       SET CLUSTER SETTING sql.txn.read_committed_isolation.enabled = false;
--   * Do not configure a SECONDARY REGION: CockroachDB does not support it
--     together with REGIONAL BY ROW tables.
--   * A multi-node cluster needs a license key after a 7-day grace period:
--       SET CLUSTER SETTING cluster.organization = '...';
--       SET CLUSTER SETTING enterprise.license = '...';

-- ---------------------------------------------------------------------------
-- Idempotency records (store/migrations/0001_records.sql)
-- ---------------------------------------------------------------------------

-- LOCALITY REGIONAL BY ROW AS crdb_region: the table and every index are
-- partitioned by crdb_region, and each partition's leaseholder (and 2 of its
-- 5 voters) live in that region.
--
-- crdb_region is COMPUTED from home_region, the region of the node that
-- claimed the key (idemd writes it on every claim and on every reuse after
-- the window). So a key's row lives in the region that serves its tenant:
--   * reads by that region (replays, the record lookups before every fenced
--     write) are served by a local leaseholder;
--   * its writes still need a cross-region acknowledgement under SURVIVE
--     REGION FAILURE (see above); under SURVIVE ZONE FAILURE they would be
--     region-local.
-- The primary key (tenant_id, operation_name, idempotency_key) does not
-- contain crdb_region, so CockroachDB keeps it unique across ALL regions:
-- claiming a NEW key (INSERT ... ON CONFLICT DO NOTHING finds no row locally)
-- also reads the other regions' partitions before it commits. That is one
-- extra cross-region read per fresh claim, in parallel to all other regions,
-- whatever the survival goal; it is the price of one key = one record
-- worldwide, and it is not optional. (README: how to avoid it by deriving the
-- region from tenant_id instead, and what that costs.)
--
-- Why computed rather than the usual DEFAULT gateway_region(): the row then
-- follows the region that claimed it even when idemd's connection pool lands
-- on a CockroachDB gateway in another region. gateway_region() itself cannot
-- be used inside a computed column (not immutable), so an unknown or empty
-- home_region falls back to the primary region: correct, just slower. Adding
-- a region means adding its WHEN arm (README: "Adding a region").
--
-- Row-level TTL deletes exactly what the node's metadata delete
-- (store.DeleteExpired) deletes, so that the two never disagree:
--   * a SETTLED record (COMPLETED, FAILED_*, or EXPIRED: pruned) ...
--   * ... that keeps no answer: its body and headers were dropped by the
--     node (store.PruneBodies, once past its window and --body-retention
--     after its creation), or it never kept one (it renders its answer from
--     the resource it references) ...
--   * ... once the metadata retention has passed after its window:
--     expires_at is the window's end (the store's clock), + INTERVAL
--     '168 hours' is IDEM_METADATA_RETENTION's default (168h). Hours, not
--     days: an interval of days added to a TIMESTAMPTZ depends on the
--     session's time zone (a day can be 23 or 25 hours), the node's
--     retention does not.
--   * The body retention is the node's alone: the TTL never deletes a record
--     that still keeps its answer, however old, so IDEM_BODY_RETENTION needs
--     no copy here. (A TTL of "7 days after the window" whatever the record
--     kept deleted answers a longer body retention still promised.)
--   * IN_PROGRESS and UNKNOWN_REQUIRES_RECOVERY get no expiration (the CASE
--     yields NULL, and the job deletes only rows whose expression is
--     <= now()): money may have moved for those, so they are never
--     forgotten (the node's cleanup has the same rule).
--   * A row is never deleted before its window ends: the expression is at
--     least expires_at. The TTL job selects candidates at a slightly old
--     timestamp, but its DELETE re-checks the expression on the current row,
--     so a key reused for a new generation in between (new expires_at,
--     status IN_PROGRESS) is not deleted.
--   * A record goes at the earlier of this interval and the node's own
--     IDEM_METADATA_RETENTION (its delete keeps running): set the node's a
--     little longer to leave the deleting to the TTL.
--   * @hourly bounds how late a row goes (about an hour plus the job's run);
--     ttl_delete_batch_size = 500 matches the node's --cleanup-batch.
-- deploy/deploy_test.go runs this expression on PostgreSQL against the
-- node's cleanup (TestTTLDeletesWhatCleanupDeletes).
--
-- A record settled by hand (`idemctl records settle`) keeps who settled it,
-- when and why in four nullable columns the engine's migration 0011 adds
-- (settled_as, settled_by, settled_at, settled_reason), applied here by
-- `idemctl migrate` like every migration after 0001: they follow the row's
-- crdb_region, rewrite no rows, and change nothing above; a settled record
-- goes at the same time as any other, its audit with it.
--
-- The raw hash of the request that claimed a record (raw_hash: its body's
-- bytes with what else its command is parsed from, for a byte-equal retry
-- to replay from memory unparsed) is one more nullable column, the engine's
-- migration 0012, applied the same way: it follows the row's crdb_region,
-- rewrites no rows, and changes nothing above.
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
    crdb_region crdb_internal_region NOT VISIBLE NOT NULL AS (
        CASE home_region
            WHEN 'eu-west'  THEN 'eu-west'
            WHEN 'us-east'  THEN 'us-east'
            WHEN 'ap-south' THEN 'ap-south'
            ELSE 'eu-west'
        END
    ) STORED,
    PRIMARY KEY (tenant_id, operation_name, idempotency_key)
) WITH (
    ttl_expiration_expression = $$CASE WHEN status IN ('COMPLETED', 'FAILED_REPLAYABLE', 'FAILED_RETRYABLE', 'EXPIRED')
        AND response_body IS NULL AND response_headers IS NULL THEN expires_at + INTERVAL '168 hours' END$$,
    ttl_job_cron = '@hourly',
    ttl_delete_batch_size = 500
) LOCALITY REGIONAL BY ROW AS crdb_region;

-- Same names as the migration, so idemd's CREATE INDEX IF NOT EXISTS would be
-- a no-op. On a REGIONAL BY ROW table both are partitioned by crdb_region
-- automatically; neither is UNIQUE, so neither costs a uniqueness check.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_records_open ON idempotency_records (locked_until)
    WHERE status IN ('IN_PROGRESS', 'UNKNOWN_REQUIRES_RECOVERY', 'FAILED_RETRYABLE');

-- ---------------------------------------------------------------------------
-- Payments and outbox (store/migrations/0002_payments.sql)
-- ---------------------------------------------------------------------------

-- Per-tenant rows written in the same transaction as the claim, by the same
-- node: plain LOCALITY REGIONAL BY ROW, whose hidden crdb_region column
-- defaults to the gateway's region. With IDEM_DATABASE_URL pointing at the
-- CockroachDB nodes of the idemd node's own region (it must), that is the
-- claiming region, the same home as the record's.
--
-- payments_merchant_reference_key stays UNIQUE over (tenant_id, account_id,
-- merchant_reference) WITHOUT crdb_region: CockroachDB then checks it across
-- all regions on every insert (a cross-region read). Adding crdb_region to it
-- would make it per-region, and two regions racing through a failover could
-- each accept the same merchant reference. This business constraint is what
-- still catches a duplicate that arrives with a fresh key, in another region,
-- at the same moment: keep it global. Keep its NAME too: idemd recognises
-- the violation by constraint name (409 DUPLICATE_MERCHANT_REFERENCE).
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
    CONSTRAINT payments_merchant_reference_key UNIQUE (tenant_id, account_id, merchant_reference)
) LOCALITY REGIONAL BY ROW;

-- The outbox event commits with its payment, so it lives with it. event_id
-- is a derived, stable id (not a random UUID): it stays globally unique.
-- Note for capacity planning: the publisher on every node scans unpublished
-- events of ALL regions (ORDER BY created_at cannot stay in one partition),
-- so each pass (IDEM_OUTBOX_INTERVAL, default 200ms) reads across regions.
CREATE TABLE IF NOT EXISTS outbox_events (
    event_id      TEXT        NOT NULL PRIMARY KEY,
    tenant_id     TEXT        NOT NULL,
    aggregate_id  TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ
) LOCALITY REGIONAL BY ROW;

CREATE INDEX IF NOT EXISTS outbox_events_unpublished ON outbox_events (created_at) WHERE published_at IS NULL;

-- ---------------------------------------------------------------------------
-- Messaging (store/migrations/0003_messaging.sql)
-- ---------------------------------------------------------------------------

-- Deliveries are written by whichever node published them. delivery_id is
-- DEFAULT gen_random_uuid(): CockroachDB skips the cross-region uniqueness
-- check for such columns by default, so inserts here stay cheap.
CREATE TABLE IF NOT EXISTS queue_messages (
    delivery_id   UUID        NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    consumer_name TEXT        NOT NULL,
    message_id    TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    tenant_id     TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    enqueued_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at  TIMESTAMPTZ
) LOCALITY REGIONAL BY ROW;

CREATE INDEX IF NOT EXISTS queue_messages_pending ON queue_messages (consumer_name, enqueued_at)
    WHERE processed_at IS NULL;

-- The inbox is not per-tenant, but it is written in the same transaction as
-- the consumer's effect (ledger entry, email row) by the consuming node, so
-- REGIONAL BY ROW keeps that transaction's writes in one region. Its primary
-- key (consumer_name, message_id) is the deduplication itself and must stay
-- unique across regions: a message delivered twice, to consumers in two
-- regions, is processed once.
CREATE TABLE IF NOT EXISTS consumer_inbox (
    consumer_name TEXT        NOT NULL,
    message_id    TEXT        NOT NULL,
    status        TEXT        NOT NULL,
    processed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    error_code    TEXT,
    PRIMARY KEY (consumer_name, message_id)
) LOCALITY REGIONAL BY ROW;

-- One ledger entry per (entry type, payment), worldwide: the second line of
-- defence behind the inbox. Global, and named as in the migration.
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
) LOCALITY REGIONAL BY ROW;

-- dedupe_key (receipt_payment_<id>) is the primary key: one email per payment,
-- worldwide.
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
) LOCALITY REGIONAL BY ROW;

CREATE INDEX IF NOT EXISTS email_notifications_unsent ON email_notifications (created_at)
    WHERE sent_at IS NULL;

-- The mail sink. Deliberately without a unique constraint (a double send must
-- show as two rows); random UUID key, so no uniqueness check either.
CREATE TABLE IF NOT EXISTS sent_emails (
    send_id    UUID        NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    dedupe_key TEXT        NOT NULL,
    tenant_id  TEXT        NOT NULL,
    recipient  TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    body       TEXT        NOT NULL,
    sent_at    TIMESTAMPTZ NOT NULL DEFAULT now()
) LOCALITY REGIONAL BY ROW;

CREATE INDEX IF NOT EXISTS sent_emails_dedupe_key ON sent_emails (dedupe_key);

-- ---------------------------------------------------------------------------
-- Migration bookkeeping (store/migrate.go)
-- ---------------------------------------------------------------------------

-- Same shape as idemd creates them. Each migration set (the engine's,
-- payments', an operation's own) keeps its own sequence of versions, keyed
-- by set_name. Both tables are left REGIONAL BY TABLE IN PRIMARY REGION (the
-- default): they are read and written once per migration run. GLOBAL would
-- make those reads local but every write slower, and nothing here is hot.
CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name   TEXT        NOT NULL DEFAULT '',
    version    INT         NOT NULL,
    name       TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (set_name, version)
) LOCALITY REGIONAL BY TABLE IN PRIMARY REGION;

-- The migration lock: one row while a process migrates (a row, not an
-- advisory lock: CockroachDB has none).
CREATE TABLE IF NOT EXISTS schema_migrations_lock (
    name       TEXT        NOT NULL PRIMARY KEY,
    owner      TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
) LOCALITY REGIONAL BY TABLE IN PRIMARY REGION;

-- The three migrations above are applied (in their multi-region form): the
-- engine's 0001 and payments' 0002 and 0003.
INSERT INTO schema_migrations (set_name, version, name) VALUES
    ('engine', 1, '0001_records.sql'),
    ('payments', 2, '0002_payments.sql'),
    ('payments', 3, '0003_messaging.sql')
ON CONFLICT (set_name, version) DO NOTHING;

-- Who settled a record by hand, when and why (store.Store.Settle, `idemctl
-- records settle`, the node's POST /v1/admin/records/.../settle): a person
-- who asked downstream what happened to a record that recovery could not
-- settle. settled_as is what they settled it as (the status moves on when a
-- retry takes a FAILED_RETRYABLE record over; these columns stay, as the
-- last settlement by hand of the key while its record exists). All NULL for
-- a record nobody settled by hand. Nullable columns without a default
-- rewrite no rows (PostgreSQL, CockroachDB); one column per statement, as
-- CockroachDB wants schema changes.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS settled_as TEXT;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS settled_by TEXT;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS settled_at TIMESTAMPTZ;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS settled_reason TEXT;

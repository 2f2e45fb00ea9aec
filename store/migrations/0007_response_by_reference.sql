-- A referencing record keeps its answer's status and schema version with
-- the resource reference (resource_type, resource_id) but not its headers
-- or body: the operation renders them again from the resource on replay
-- (idem.Response.ByReference). Adding a column with a constant default
-- rewrites no rows (PostgreSQL 11+, CockroachDB).
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS response_by_reference BOOLEAN NOT NULL DEFAULT false;

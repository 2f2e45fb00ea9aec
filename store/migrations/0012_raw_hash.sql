-- The raw hash of the request that claimed a record (idem.Record.RawHash,
-- fingerprint.RawHash: its body's bytes with everything else its command is
-- parsed from), beside its request hash: a retry with the same bytes is
-- known to be the same command without parsing it, when its answer is kept
-- in memory (engine.AnswerCache). NULL for a record claimed before this
-- column, or without a raw hash: such a record is compared by its request
-- hash, as every record was before. A nullable column without a default
-- rewrites no rows (PostgreSQL, CockroachDB).
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS raw_hash TEXT;

-- The identity of the claim that last took a record (insert or takeover): a
-- random id the store draws per claim. When the connection drops while the
-- claim's COMMIT is in flight, the claim is run again and finds its own
-- record by this id instead of taking it for someone else's.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS claim_id TEXT;

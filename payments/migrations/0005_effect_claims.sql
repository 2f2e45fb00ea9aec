-- Consumer effects claimed once across regions (outbox.EffectGuard): the
-- first region to claim an effect (a ledger entry id, a receipt's dedupe
-- key, derived from the payment) produces it. In global store mode this
-- table lives in the store every region shares; in region-local mode in
-- the effects database (idemd --effects-database-url), where the node
-- creates it.
CREATE TABLE IF NOT EXISTS effect_claims (
    effect_key TEXT        NOT NULL PRIMARY KEY,
    region     TEXT        NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

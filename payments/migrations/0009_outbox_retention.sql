-- What the outbox's retention (outbox.Prune) deletes, oldest first: events
-- published, deliveries processed, inbox rows and receipts sent longer ago
-- than the retention. Without these indexes each pruning batch would read
-- its whole table; with them it reads the rows it deletes.
--
-- On a large table, build them beforehand without blocking writes
-- (PostgreSQL: CREATE INDEX CONCURRENTLY ... with the same definitions);
-- IF NOT EXISTS then makes this migration skip them.
CREATE INDEX IF NOT EXISTS outbox_events_published ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS queue_messages_processed ON queue_messages (processed_at)
    WHERE processed_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS consumer_inbox_processed ON consumer_inbox (processed_at);
CREATE INDEX IF NOT EXISTS email_notifications_sent ON email_notifications (sent_at)
    WHERE sent_at IS NOT NULL;

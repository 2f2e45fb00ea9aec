// Package outbox delivers the reference domain's outbox events to consumers
// with exactly-once effects over at-least-once delivery.
//
// # Outbox
//
// The payments code writes a business row and its event (outbox_events) in
// one transaction, so an event exists if and only if its change committed.
// A [Publisher] moves unpublished events into queue_messages, one row per
// subscribed consumer (fan-out), and marks them published, all in one
// transaction. Publishers need no leader: each batch locks its events with
// SELECT ... FOR UPDATE SKIP LOCKED, so any number of nodes can publish at
// once without publishing an event twice. [Publisher.Lag] is the age of the
// oldest unpublished event, by the store's clock.
//
// Delivery is still only at-least-once by contract: queue_messages.message_id
// (the event id) is not unique, and [PublisherConfig.Duplicate] deliberately
// enqueues every delivery twice to prove that consumers cope.
//
// # Inbox
//
// [Consumers.ConsumeBatch] takes a batch of one consumer's undelivered rows
// (FOR UPDATE SKIP LOCKED) in one transaction. For each delivery it first
// inserts (consumer_name, message_id) into consumer_inbox with ON CONFLICT DO
// NOTHING. If the row already existed the delivery is a duplicate: it is only
// marked processed. Otherwise the consumer's [Handler] runs in the same
// transaction, so the inbox row, the handler's durable effect and the
// delivery's processed mark commit together or not at all: a message is
// never marked processed before its effect exists. Handlers also write their
// effects with natural unique keys (ON CONFLICT DO NOTHING), a second line of
// defence that does not depend on the inbox.
//
// A handler's failure must leave no partial effect. A batch first runs with
// no savepoints (the inbox rows of the whole batch claimed in one
// statement); when a handler fails, that attempt is rolled back and the batch
// runs again with each delivery under a savepoint. A handler error then
// rolls back to it, so the failed message leaves neither an inbox row nor
// any partial effect, and its delivery stays pending for a later batch,
// while the rest of the batch commits. A handler that can never succeed for a message returns [Reject]:
// the inbox records the message as REJECTED with an error code and the
// delivery is marked processed (dead-lettered). Serialization failures,
// connection failures and cancellation abort the whole batch instead, and the
// store retries it from the start when that is safe.
//
// Publishing, consuming and sending run at READ COMMITTED
// (store.Store.ExecTxReadCommitted): their correctness rests on row locks
// (FOR UPDATE SKIP LOCKED re-checks each row it locks) and unique
// constraints (the inbox row, the effects' natural keys, ON CONFLICT), not
// on what a read saw, and at SERIALIZABLE their stream of batches would fill
// PostgreSQL's shared table of predicate locks beside the request traffic.
//
// The built-in consumers are [ConsumerLedger] (a ledger_entries row per
// PaymentCreated and PaymentConfirmed event, entry ids
// "ledger_payment_created_<paymentId>" and "ledger_payment_<paymentId>",
// unique per (entry_type, source_payment_id)) and [ConsumerReceiptEmail] (an
// email_notifications row with dedupe key "receipt_payment_<paymentId>" per
// PaymentConfirmed event). Deliveries are not ordered: handlers must not
// depend on the order of events.
//
// # Side effects outside the database
//
// A receipt email is a side effect the database cannot roll back. The
// receipt-email consumer therefore only persists the email to send, under its
// unique dedupe key; a [Sender] sends it later. [Sender.SendBatch] claims
// unsent rows for a lease (a committed claim, so no other sender takes them),
// calls the [Mailer] outside any transaction, and then records sent_at. The
// store's transactions may be retried, and a retried transaction must have no
// effect outside the database, so the mailer is never called inside one.
//
// A mailer's answer can be lost: a sender crashes (or its store becomes
// unreachable, or a send outlives the lease, or the connection drops after
// the mail system took the email) after the mailer accepted an email and
// before sent_at is committed. The email is then claimed again (at once
// after a failed send, after the lease otherwise). A mailer that implements
// [SentLookup] is asked first whether an email on its second or later
// attempt went out, and one that did is only recorded as sent, as the
// payments flow asks its provider before it charges again; with any other
// mailer sending is at-least-once. [SinkMailer] records every send as its
// own row in sent_emails, without a unique constraint, so a re-send would
// show as two rows, and implements SentLookup. An email provider that
// accepts an idempotency key (pass [Email.DedupeKey]) closes that window
// too.
//
// [Prune] deletes what the outbox no longer needs once it is older than a
// retention: published events, processed deliveries, sent receipts, and
// inbox rows no pending delivery may still ask for (an inbox row must
// outlive every redelivery of its message). Nodes run it as the
// outbox-prune worker (idemd --outbox-retention, a week by default).
package outbox

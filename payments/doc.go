// Package payments is the reference operation of the service, POST /payments
// (operation name create_payment), built on the idempotency engine like any
// user's operation: its checkpoints and error codes (codes.go), its tables
// (Migrations, installed by Migrate), and its engine operation
// (EngineOperation), whose Recover asks the provider before it charges
// again; a node's recovery worker runs it through the engine with every
// other operation's (engine.RecoverStale).
//
// A request is a Call (Prepare: the parsed command, its fingerprint, and a
// claim, Execute and Recover bound to it; create.go). The node's POST
// /payments runs it behind the idempotency middleware (idemhttp, with
// Hooks.Command and a handler that calls Execute), and Create runs it
// through the engine (engine.Engine.Do) for Go callers. The engine's hooks keep what payments
// needs: its claim (engine.ClaimFunc) claims the key in the statement that
// writes the payment row and its event, and, without a provider, completes
// the record there too, so record, payment and outbox event commit in one
// transaction; with a provider, Execute and Recover record each outcome in
// one transaction with the payment's status and event (engine.Result
// Stored). A completed payment's record references the payment instead of
// storing its 201 answer (idem.Response.ByReference; Config.StoreBodies
// keeps the body): the answer shows the payment as created, a pure
// function of its immutable fields and the schema version (render.go,
// with a golden answer per schema in testdata), so a replay renders it
// again byte for byte. Replays follow the replay rule (ReplayAsStored or
// ReconstructCurrent, the operation's engine Replay). A takeover resumes
// from the record's checkpoint: a client's retry charges a payment left at
// LOCAL_PAYMENT_CREATED, the recovery worker (engine.Attempt Background)
// only releases it. Takeovers use the engine's etcd locks and tokens
// (LockKey), so a client's retry and the recovery worker fence each other.
//
// A payment's identity is derived, not drawn at random: the payment id hashes
// its business identity (tenant, account, merchant reference), and the
// provider's idempotency key is "provider_payment_" + the payment id. Any
// region that sees the same payment derives the same identities, whatever
// idempotency key the client sent, which is what lets downstream
// deduplication survive retries, crashes and region failovers.
package payments

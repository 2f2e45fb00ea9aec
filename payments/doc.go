// Package payments is the reference operation of the service, POST /payments
// (operation name create_payment), built on the idempotency engine like any
// user's operation: its checkpoints and error codes (codes.go), its tables
// (Migrations, installed by Migrate), and its engine operation
// (EngineOperation), whose Recover asks the provider before it charges
// again; a node's recovery worker runs it through the engine with every
// other operation's (engine.RecoverStale).
//
// Create keeps a claim of its own beside the engine's: it claims the key in
// the same statement that writes the payment row (and, without a provider,
// the completed record, the payment and its outbox event in one statement),
// which the engine's claim-then-execute cannot express without two more
// writes per payment; replays follow the replay rule (ReplayAsStored or
// ReconstructCurrent). Takeovers use the same etcd locks and tokens as the
// engine (LockKey), so both fence each other.
//
// A payment's identity is derived, not drawn at random: the payment id hashes
// its business identity (tenant, account, merchant reference), and the
// provider's idempotency key is "provider_payment_" + the payment id. Any
// region that sees the same payment derives the same identities, whatever
// idempotency key the client sent, which is what lets downstream
// deduplication survive retries, crashes and region failovers.
package payments

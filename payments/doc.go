// Package payments is the reference operation of the service, POST /payments
// (operation name create_payment), built on the idempotency engine.
//
// A payment's identity is derived, not drawn at random: the payment id hashes
// its business identity (tenant, account, merchant reference), and the
// provider's idempotency key is "provider_payment_" + the payment id. Any
// region that sees the same payment derives the same identities, whatever
// idempotency key the client sent, which is what lets downstream
// deduplication survive retries, crashes and region failovers.
package payments

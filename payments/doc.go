// Package payments is the reference operation of the service, POST /payments
// (operation name create_payment), built on the idempotency engine.
//
// A payment's identity is derived, not drawn at random: the payment id hashes
// the scope (tenant, operation, key), the request hash and the key's
// generation, and the provider's idempotency key is "provider_payment_" + the
// payment id. Any region that sees the same scoped command derives the same
// identities, which is what lets downstream deduplication survive retries,
// crashes and region failovers.
package payments

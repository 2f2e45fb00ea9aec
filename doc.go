// Package idem is the domain vocabulary of the idempotency coordination service:
// the scope of a key, the record and its states, the outcomes a claim can have,
// the rules that decide between them, and the errors (with stable codes) that a
// client can see.
//
// The package has no dependencies on storage or transport. Adapters live in
// subpackages named for what they wrap:
//
//   - store: records (and the reference payment tables) on PostgreSQL or
//     CockroachDB through pgx, with serializable transactions and migrations.
//   - fingerprint: canonical request hashing (RFC 8785 JSON, SHA-256, versioned).
//   - payments: the reference operation POST /payments.
//   - region: the regional HTTP node (API, metrics, health).
//   - cmd/idemd and cmd/idemctl: the node and the operator tool.
//
// The central rule is insert-first: the right to execute comes from one atomic
// insert of the scoped key, never from a read followed by an insert. See
// [Decide] for how an existing record answers a later request.
package idem

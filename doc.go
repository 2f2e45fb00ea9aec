// Package idem is the domain vocabulary of the idempotency coordination service:
// the scope of a key, the record and its states, the outcomes a claim can have,
// the rules that decide between them, and the errors (with stable codes) that a
// client can see.
//
// The package has no dependencies on storage or transport. Adapters live in
// subpackages named for what they wrap:
//
//   - engine: drives one scoped operation end to end over any [Coordinator]
//     (claim, execute or replay, recover, fencing).
//   - idemhttp: the middleware that makes a net/http handler idempotent, and
//     the one table of error codes every HTTP surface answers with (RFC 9457
//     problems).
//   - sidecar: idempotency in front of an existing HTTP service, with no
//     change to it (idemd --proxy-routes).
//   - coordclient: the Go client of a node's coordination API, itself a
//     [Coordinator].
//   - store: records on PostgreSQL or CockroachDB through pgx, with
//     serializable transactions and migrations, and what an operation with
//     tables of its own needs to write them with its records.
//   - memcoord: a [Coordinator] in memory, for unit tests (not durable, one
//     process); coordtest: the contract suite a Coordinator must pass.
//   - fingerprint: canonical request hashing (RFC 8785 JSON, SHA-256, versioned).
//   - fencing: recovery ownership through etcd leases; tokens are revisions.
//   - routing: which region is home for a tenant, forwarding, failover.
//   - payments: the reference operation POST /payments, built like any
//     user's operation.
//   - region: the regional HTTP node (API, metrics, health).
//   - cmd/idemd and cmd/idemctl: the node and the operator tool.
//
// The central rule is insert-first: the right to execute comes from one atomic
// insert of the scoped key, never from a read followed by an insert. See
// [Decide] for how an existing record answers a later request.
package idem

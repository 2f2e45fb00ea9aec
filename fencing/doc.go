// Package fencing gives a process exclusive, fenced ownership of a scoped
// key — for example the right to recover one in-flight idempotency record —
// across regions, using etcd.
//
// # Model
//
// Ownership is an etcd lock per scoped key, held under an etcd lease that
// this process keeps alive (a Lease). A Locker takes locks under one
// Lease; TryLock either wins the key or fails at once with ErrLocked.
//
// A lock alone cannot make a distributed side effect exclusive: the owner
// can be paused (GC, VM migration, a stopped container) or partitioned
// after its last check, and its write can land after etcd has expired its
// lease and handed the key to someone else. Two mechanisms close that gap:
//
//   - Fencing tokens. Lock.Token is the create revision of the lock's etcd
//     key. etcd revisions only grow, so each later owner of a key holds a
//     strictly higher token than every earlier one. Every write an owner
//     makes carries its token, and the resource (a store row, a payment
//     provider's idempotency scope) remembers the highest token it has seen
//     and rejects anything lower. A stale owner's late write is therefore
//     refused by the resource itself, whatever the owner believes.
//
//   - A local deadline. The owner stops working on its own, without asking
//     etcd, at Lease.Deadline: the time the last successful keepalive was
//     SENT, plus the TTL etcd granted, minus a safety margin. etcd renews a
//     lease no earlier than it receives the keepalive, so its expiry is at
//     or after send time + TTL; stopping margin earlier means the owner
//     goes quiet before etcd can give the key to anyone else, even if it is
//     partitioned from etcd or its process was paused. Owners call
//     Lock.Check before each write or side effect, and may watch
//     Lease.Done to abandon work promptly.
//
// The deadline compares two intervals measured by different clocks (this
// process's and the etcd leader's), so its safety rests on bounded clock
// RATE drift over one TTL — not on synchronised wall clocks. It is the
// same argument that Spanner and CockroachDB make for leaseholders. The
// default margin of TTL/5 tolerates 20% relative drift, far beyond real
// oscillators; the margin also absorbs scheduling delay between Check and
// the write. The deadline uses Go's monotonic clock by default (WithClock
// replaces it in tests), so wall-clock steps (NTP, manual changes) do not
// move it. Tokens remain the line of defence when everything else fails.
//
// # Lifecycle
//
// Once a lease's local deadline passes without renewal, or etcd reports
// the lease gone, or Close is called, the Lease is dead for good: Valid
// stays false, Done is closed, keepalives stop (so etcd expires the lease
// and releases its locks within one TTL), and every Lock under it fails
// Check. A dead Lease is not revived by a late keepalive response; grant a
// new one.
//
// Ownership of resources:
//
//   - The caller owns the *clientv3.Client and closes it after the Leases
//     and Lockers built on it.
//   - Grant's keepalive goroutine is stopped by Lease.Close, which also
//     revokes the lease (best effort), releasing every lock held under it.
//   - A Locker owns a concurrency.Session on the Lease's lease ID. The
//     session never revokes the lease; its own keepalive stream is bound
//     to the Lease and ends when the Lease dies or is closed. Locker.Close
//     ends it earlier.
//   - A Lock is released by Unlock, or by the end of its lease.
package fencing

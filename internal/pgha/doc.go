// Package pgha runs a replicated PostgreSQL store whose failover is managed
// by Patroni (the Debian package "patroni", 3.0.x), on an etcd cluster the
// caller already runs: one Patroni agent and one PostgreSQL server per
// member, typically one member per region.
//
// The store is configured so that an acknowledged commit survives the loss
// of the primary and an isolated primary cannot acknowledge commits:
//
//   - synchronous_mode and synchronous_mode_strict: every other member is
//     a synchronous standby (synchronous_node_count is the member count
//     minus one), every commit waits until each standby the primary names
//     has flushed it, and with no synchronous standby left commits wait
//     rather than go through. With every standby synchronous, the one
//     promoted is the one furthest ahead, so no other member has WAL the
//     new primary lacks: the others follow its new timeline at once
//     instead of stopping for pg_rewind, as a replica that had received
//     more of the old primary's stream than the promoted one must (with
//     one synchronous standby of two, that rewind held every commit of the
//     new primary for about 11s of a partition's failover). A standby
//     that is gone is dropped from the names, and commits wait for the
//     others;
//   - the leader key lives in etcd (Patroni's etcd3 support, through etcd's
//     v3 gRPC gateway) with a TTL (Options.TTL): a primary that cannot renew
//     it demotes itself, and only the synchronous standby, which has every
//     acknowledged commit, may be promoted.
//
// Clients connect with [Cluster.URL], a multi-host URL with
// target_session_attrs=read-write, so that pgx finds the writable member
// and, after a failover, finds the new one on its next connection.
//
// Why Patroni rather than pg_auto_failover: pg_auto_failover decides
// failovers in its monitor, which is itself a single PostgreSQL node, a
// second single point of failure outside the etcd cluster the service
// already runs; Patroni keeps its state and leader lease in that etcd and
// fences an old primary with the lease.
//
// When the caller runs as root, Patroni and PostgreSQL run as the
// "postgres" OS user, as in package pgserver; passwords are in the
// members' configuration files (mode 0600), never on a command line.
package pgha

// Package collectors holds the Prometheus collectors a node registers
// beyond its own metrics: the standard ones (Go runtime, process, build
// information), the store's connection pool (pgx) and the etcd client's
// requests (gRPC).
//
// It is apart from package telemetry because it pulls pgx and gRPC, which
// the library packages that log and trace through telemetry (engine, store)
// must not bring into their users' builds. Only the node (package region)
// and its programs import it. Nothing here registers anything globally:
// collectors go on the registerer a caller passes.
package collectors

// Package chaos is idem's fault-injection harness, modelled on etcd's
// tests/robustness: it starts a real multi-region cluster (package
// cluster: PostgreSQL, three etcd members, the provider simulator and
// idemd nodes, every network link through an in-process toxiproxy), drives
// it with concurrent clients while it injects faults, records every call
// and its answer, and then checks the history, every region's store and
// the provider's charges.
//
// # A run
//
// [Run] runs one scenario of the [Catalogue] (or several, or all of them),
// each on a cluster of its own:
//
//  1. Clients (WorkloadConfig) send POST /payments to random regions with
//     keys of their own, and retry an ambiguous answer (a timeout, a 5xx,
//     202 PAYMENT_OUTCOME_UNKNOWN, 409 IN_PROGRESS) with the same key in
//     another region, re-serialising the same command differently. Some
//     clients are buggy on purpose (a key reused with another amount; a
//     command resent with a fresh key). Every call is recorded ([Op]).
//  2. After a warm-up, whose rate must reach Options.MinRate or the run is
//     invalid, each [Fault] of the scenario is injected and healed in turn;
//     the cluster's health (every node's /readyz, every etcd member's
//     /health, the provider's /healthz) is checked before and after each.
//  3. The traffic stops, open calls finish their retries, the harness waits
//     for recovery and the outboxes to settle, and resends every answered
//     command once more.
//  4. The checks ([Checks]) run over the history, the stores and the
//     provider's charge counts, including a per-key linearizability check
//     with porcupine; the [Report] is written as report.json and a
//     self-contained report.html.
//
// # Faults
//
// Faults implement [Fault]. Network faults cut or slow the cluster's
// links; process faults kill, freeze or restart processes; configuration
// faults restart nodes with other flags or environment (a clock skew, a
// failpoint, a schema change, duplicate delivery) through a wrapper script
// that the cluster runs as idemd, because a cluster.Process keeps the
// command line it was started with; provider faults use the simulator's
// admin API, with the cluster's providerAdminKey; a region failover moves placements in etcd and hands records
// over as an operator would.
//
// # Honesty
//
// With Options.Break, every idemd runs a deliberately broken engine
// (--break find-then-insert, no-fencing or raw-body-hash). Such a run must
// fail, and [ScenarioFor] names the scenario built to catch each mode; the
// package's tests prove that it does.
//
// The faults and broken engines are compiled into idemd only with
// -tags failpoints ([BuildCommand]); a run refuses any other idemd
// ([RequireFailpoints]).
package chaos

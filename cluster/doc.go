// Package cluster starts a local idempotency cluster made of real processes:
// a throwaway PostgreSQL server (through internal/pgserver) and idemd nodes
// grouped into regions. It backs "idemctl up" and is meant to be reused by
// tests and by a chaos harness, which reach individual nodes through
// [Cluster.Node] to kill, signal and restart them.
//
// # Layout
//
// [Start] creates, in the state directory (Config.StateDir, or a temporary
// directory removed by [Cluster.Stop]):
//
//	cluster.json            Info as JSON, written once every node is ready, removed by Stop
//	logs/<region>-<i>.log   stdout and stderr of node i of a region (appended)
//	postgres/               PostgreSQL's data and log (only with a StateDir)
//
// Each region runs in region-local store mode: region R gets its own
// database idem_<R with "-" as "_"> on the shared server, and every node of
// the region uses it. Nodes listen on free ports on 127.0.0.1 and
// authenticate one random development token (dev_<hex>) per tenant.
//
// # Process lifetime
//
// Every child runs in a process group of its own, so a Ctrl-C in a terminal
// reaches only the caller, which then stops the children in order. Children
// are started from a goroutine locked to its OS thread for their whole life,
// with a parent-death signal (SIGKILL for nodes, SIGQUIT for PostgreSQL): if
// the process that started the cluster dies, even by SIGKILL, no node or
// server outlives it. [Cluster.Stop] terminates every node (SIGTERM, then
// SIGKILL after a grace period), then PostgreSQL, and returns once all of
// them have been reaped.
package cluster

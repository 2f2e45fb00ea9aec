// Package cluster starts a local idempotency cluster made of real processes:
// a throwaway PostgreSQL server (through internal/pgserver), optionally a
// real etcd cluster and the payment provider simulator, and idemd nodes
// grouped into regions. It backs "idemctl up" and is meant to be reused by
// tests and by a chaos harness, which reach individual processes through
// [Cluster.Node], [Cluster.EtcdMembers] and [Cluster.Provider] to kill,
// signal and restart them, and, in a proxied cluster, cut or slow the
// network links between them ([Cluster.Partition], [Cluster.AddLatency]).
//
// # Layout
//
// [Start] creates, in the state directory (Config.StateDir, or a temporary
// directory removed by [Cluster.Stop]):
//
//	cluster.json            Info as JSON, written once every process is ready, removed by Stop
//	logs/<region>-<i>.log   stdout and stderr of node i of a region (appended)
//	logs/etcd-m<i>.log      the same for etcd member i
//	logs/provider.log       the same for the provider simulator
//	secrets/                auth-tokens (idemd's --auth-tokens-file), admin-tokens (its
//	                        --admin-tokens-file) and admin-token (that token alone, Info's
//	                        AdminTokenFile), provider-api-key and provider-admin-key:
//	                        mode 0700, files 0600, removed by Stop
//	postgres/               PostgreSQL's data and log (only with a StateDir; a link to
//	                        /var/tmp/idem-pgserver-<hash> if the postgres user cannot reach it)
//	etcd/m<i>/              etcd member i's data (new at every Start)
//	store-ha/<member>/      with Config.StoreHA, each replicated store member's patroni.yml
//	                        (0600), data and patroni.log (new at every Start; a link to
//	                        /var/tmp/idem-pgserver-<hash> if the postgres user cannot reach it)
//	provider/               the provider simulator's charges
//	pgbouncer/              with Config.PgBouncer, its pgbouncer.ini and log (only with a
//	                        StateDir; elsewhere like postgres/); logs/pgbouncer.log links to the log
//
// In region-local store mode (the default) region R gets its own database
// idem_<R with "-" as "_"> on the shared server, and every node of the
// region uses it; in global store mode every region uses one database,
// idem_global; with Config.StoreHA that database is replicated over the
// regions by Patroni (package internal/pgha), one member per region, and
// the nodes reach it with a multi-host URL that follows the primary
// ([Cluster.Store] kills and restarts members). With Config.PgBouncer the
// nodes reach every database through one PgBouncer in transaction pooling
// in front of the server ([Cluster.PgBouncer] kills and restarts it). Every process listens on free ports on 127.0.0.1. Nodes
// authenticate one random development token (dev_<hex>) per tenant, and
// are named <region>-<i> (their --node-id). Tokens and keys reach the
// processes in the files of secrets/, never on a command line (which every
// local user can read); the provider's admin key is also in cluster.json
// (providerAdminKey, mode 0600) for tools such as the chaos harness.
//
// # Regions and etcd
//
// With Config.EtcdMembers, Start runs that many etcd members as one etcd
// cluster and, before any node starts, places the tenants round-robin over
// the regions (tenant i's home is region i modulo the number of regions),
// so that a request to any region is served from the start: by the home
// region, or forwarded there. Nodes join their region in etcd with a
// liveness lease (Config.RegionLeaseTTL). Without etcd, each region serves
// every tenant on its own, as a single-region deployment would.
//
// # Network links
//
// With Config.Proxied, every connection between the cluster's processes
// goes through a proxy of an in-process toxiproxy server, one per link
// (see [Link]): Partition drops a link, Heal restores it, AddLatency and
// AddToxic degrade it. The cluster's own connections (readiness probes,
// its etcd client, Info's URLs) are direct.
//
// # The docker environment
//
// With Config.Docker, every process runs in a container of the local
// Docker engine instead (the host's binaries on the Debian base image,
// PostgreSQL on its image, both from `idemctl images build`), each region
// on a Docker network of its own with its etcd member, the store and the
// provider on a services network, and the links, still the same toxiproxy
// proxies, served by a WAN container attached to every network. The
// network layer itself can then fail: [Cluster.IsolateRegion] drops every
// packet between a region and the WAN, [Cluster.CutOutbound] every
// connection the region opens (a one-way partition); nothing is closed,
// connections go silent as in a real partition. See docker.go.
//
// # Process lifetime
//
// Every child runs in a process group of its own, so a Ctrl-C in a terminal
// reaches only the caller, which then stops the children in order. Children
// are started from a goroutine locked to its OS thread for their whole life,
// with a parent-death signal (SIGKILL for nodes, etcd and the provider,
// SIGQUIT for PostgreSQL): if the process that started the cluster dies,
// even by SIGKILL, no child outlives it. [Cluster.Stop] terminates every
// node (SIGTERM, then SIGKILL after a grace period), then the provider, the
// etcd members, PgBouncer and PostgreSQL, and returns once all of them have been
// reaped.
package cluster

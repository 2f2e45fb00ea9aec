package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemcoord/idem/provider"
)

// Scenario is one named chaos test: the cluster's shape, the traffic and
// the faults injected while it runs.
type Scenario struct {
	Name        string
	Description string
	// Regions is how many regions the cluster has (default 2);
	// NodesPerRegion how many nodes each (default 2).
	Regions        int
	NodesPerRegion int
	// StoreMode is the cluster's store mode (default region-local).
	StoreMode string
	// StoreHA runs the global store replicated over the regions, managed
	// by Patroni (cluster.Config.StoreHA; StoreMode must be global).
	StoreHA bool
	// NodeArgs are extra idemd flags for every node.
	NodeArgs []string
	// ReplayWindow is the nodes' --replay-window (default: idemd's).
	ReplayWindow time.Duration
	// Workload shapes the traffic (Clients and ReplayWindow are filled in
	// by the run).
	Workload WorkloadConfig
	// Direct runs the scenario's cluster without proxies: its faults cut
	// and slow no link (a node or a region killed, the provider faulted,
	// the replicated store's primary lost), so its processes connect to
	// each other directly, as in production. The proxies are toxiproxy in
	// the harness's process, which copies every byte of every link: on two
	// cores that was a sixth of the machine in retry-after-expiry, taken
	// from the traffic. A fault that needs a proxied link is not available
	// on such a cluster, and the faults check fails on it.
	Direct bool
	// StoreLinksOnly proxies the replicated store's own links alone
	// (cluster.Config.ProxiedStoreOnly): the member links a partition of
	// the store cuts. The nodes, etcd and the provider connect directly, as
	// with Direct, so that the harness copies no byte of the traffic.
	StoreLinksOnly bool
	// ExtraClients are added to the run's --clients for this scenario: a
	// store that commits each write on a synchronous standby in another
	// region answers every call later, clients that wait for a window to
	// pass or for frozen owners idle meanwhile, and the same clients then
	// make fewer calls than the catalogue's 10^4 per scenario at 30s.
	ExtraClients int
	// Faults returns the fault steps, in order, for a cluster whose
	// regions are regions (regions[i] is home of the i-th tenant).
	Faults func(env *Env, regions []string) []Step
	// Catches names the --break modes this scenario is built to catch.
	Catches []string
	// Sidecar runs an upstream service in the harness, puts every node in
	// front of it (--proxy-routes, POST /transfers) and drives that route
	// too, racing each command's first attempt over every region; the
	// sidecar checks then look at it.
	Sidecar bool
	// SidecarForm makes the sidecar's clients send their commands
	// form-encoded (application/x-www-form-urlencoded), every retry with
	// the fields in another order.
	SidecarForm bool
	// DockerOnly marks a scenario whose faults exist only at the network
	// layer of the docker environment (Options.Env EnvDocker).
	DockerOnly bool
	// PgBouncer puts PgBouncer in transaction pooling between the nodes
	// and PostgreSQL (cluster.Config.PgBouncer): every node reaches its
	// store, and the effects database, through it.
	PgBouncer bool
	// GRPC runs gRPC nodes (idemctl grpc-node: Transfers/Create through
	// idemgrpc on the first region's store) beside the cluster and drives
	// them from grpc-go clients with a retry policy; the gRPC checks then
	// look at their calls and side effects.
	GRPC bool
	// IdleTenants is how many idle tenants (no traffic) get a placement of
	// their own in regions[0] before the traffic starts, written in batched
	// etcd transactions: a control plane at scale. Default none.
	IdleTenants int
}

// Step is one fault of a scenario and how long it is held.
type Step struct {
	Fault Fault
	// Hold is how long the fault stays between Inject and Heal.
	Hold time.Duration
}

// Default timings of chaos clusters.
const (
	// chaosLeaseTTL is the nodes' --region-lease-ttl.
	chaosLeaseTTL = 3 * time.Second
	// chaosLockTimeout is the nodes' --lock-timeout: a stale owner's record
	// can be taken over this long after its last write.
	chaosLockTimeout = 3 * time.Second
	// chaosStoreTTL is the replicated store's leader key TTL
	// (cluster.Config.StoreHATTL): a failover of the store takes at least
	// this long, and Patroni's default of 10s left the scenarios whose
	// store fails over serving nothing for about 16s of their 30. At 5s
	// the agents keep their 2s retry timeout (loop_wait 1s + 2 * 2s), so a
	// slow etcd demotes a primary no sooner than at 6s.
	chaosStoreTTL = 5 * time.Second
)

// baseNodeArgs are the flags every chaos node runs with: short locks and
// a busy recovery worker, so that a run settles in seconds.
var baseNodeArgs = []string{"--lock-timeout", chaosLockTimeout.String(), "--recovery-interval", "1s", "--outbox-interval", "200ms"}

// storeHANodeArgs are the extra flags of the nodes of the replicated
// store's scenarios: six nodes share one store there, and their outbox
// workers polling it every 200ms (baseNodeArgs) made many small batches;
// polled every second, the same events go in fewer, fuller ones. On two
// cores that took the store's CPU per answered call from about 3.4 to 2.6
// ms and the calls answered per second from about 255 to 310
// (store-partition, seed 76034, both ways), and the checks that every
// event is delivered and nothing stays stuck still pass.
var storeHANodeArgs = []string{"--outbox-interval", "1s"}

// Catalogue returns every scenario, in the order "all" runs them.
func Catalogue() []Scenario {
	sidecarFaults := func(env *Env, r []string) []Step {
		return []Step{
			{SidecarLoseAnswers(env), 3 * time.Second},
			{KillNode(r[0], 0), 2 * time.Second},
			{KillNode(r[1], 1), 2 * time.Second},
		}
	}
	return []Scenario{
		{
			Name: "completed-replay",
			Description: "completed payments are retried, re-serialised (field order, \"10.0\", lower-case currency, default channel omitted or added), " +
				"in another region: every retry replays the first answer byte for byte; a node crashes and restarts meanwhile",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.7},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillNode(r[1], 0), 2 * time.Second}}
			},
			Catches: []string{"raw-body-hash", "find-then-insert"},
		},
		{
			Name: "concurrent-retry",
			Description: "each key's first attempt is sent twice at once to two nodes of one region, as a client retrying " +
				"before its first try answered: one atomic claim wins, the other sees 409 IN_PROGRESS or the replay",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleRacer: 3, RoleNormal: 1}, RaceWidth: 2, RaceSameRegion: true, Replays: 0.3},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{PauseNode(r[0], 1), 2 * time.Second}}
			},
			Catches: []string{"find-then-insert"},
		},
		{
			Name: "cross-region-race",
			Description: "each key's first attempt goes to three regions at once, over a WAN with 40±20ms latency: " +
				"forwarded to the home region, one claim wins and every region answers the same bytes",
			Regions:  3,
			Workload: WorkloadConfig{Mix: map[Role]int{RoleRacer: 3, RoleNormal: 1}, RaceWidth: 3, Replays: 0.3},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{WANLatency(40*time.Millisecond, 20*time.Millisecond), 6 * time.Second}}
			},
			Catches: []string{"find-then-insert"},
		},
		{
			Name: "global-store-race",
			Description: "one store for every region (--store-mode global): each key's first attempt goes to two regions at once and " +
				"both serve it from the shared store, where one atomic claim wins; a node crashes meanwhile",
			StoreMode: "global",
			Workload:  WorkloadConfig{Mix: map[Role]int{RoleRacer: 3, RoleNormal: 1}, RaceWidth: 2, Replays: 0.3},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillNode(r[0], 1), 2 * time.Second}}
			},
			Catches: []string{"find-then-insert"},
		},
		{
			Name: "store-primary-loss",
			Description: "global store replicated over three regions (Patroni, synchronous and strict): the primary member's whole region " +
				"dies (its PostgreSQL, its Patroni agent and its nodes, SIGKILL); the synchronous standby is promoted and the nodes' " +
				"multi-host URL finds it: no acknowledged answer is lost; the store's recovery time is in the fault's notes",
			Regions:      3,
			StoreMode:    "global",
			StoreHA:      true,
			NodeArgs:     storeHANodeArgs,
			Workload:     WorkloadConfig{Mix: map[Role]int{RoleRacer: 1, RoleNormal: 2}, RaceWidth: 2, Replays: 0.3},
			ExtraClients: 8,
			Direct:       true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{StorePrimaryLoss(), 2 * time.Second}}
			},
		},
		{
			Name: "store-partition",
			Description: "global store replicated over three regions: the primary member is cut from its replicas and from etcd while the " +
				"nodes still reach it; it acknowledges nothing it could lose (strict synchronous replication, then it demotes itself), " +
				"a replica is promoted, and every write the isolated member acknowledged is on the new primary (no split brain)",
			Regions:        3,
			StoreMode:      "global",
			StoreHA:        true,
			NodeArgs:       storeHANodeArgs,
			Workload:       WorkloadConfig{Mix: map[Role]int{RoleRacer: 1, RoleNormal: 2}, RaceWidth: 2, Replays: 0.3},
			ExtraClients:   12,
			StoreLinksOnly: true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{StorePartition(), 2 * time.Second}}
			},
		},
		{
			Name: "partial-local-success",
			Description: "nodes crash between the local commit (payment row, PROVIDER_REQUEST_SENT) and the provider's answer, " +
				"and a region loses its store mid-request: retries and the recovery worker finish or release every record, never charging twice",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{CrashMidRequest(env, r[0], 0, "before-provider-call", time.Second), 2 * time.Second},
					{StoreUnavailable(r[1]), 3 * time.Second},
				}
			},
		},
		{
			Name: "unknown-downstream",
			Description: "the provider charges but its answer is lost (lose-answer), or answers after the node's provider timeout (slow): " +
				"clients get 202 PAYMENT_OUTCOME_UNKNOWN; retries and the recovery worker ask the provider and answer the real outcome, charged once",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Direct:   true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{ProviderFault(env, provider.Fault{Mode: provider.FaultLoseAnswer}), 3 * time.Second},
					{ProviderFault(env, provider.Fault{Mode: provider.FaultSlow, Delay: 1500 * time.Millisecond}), 3 * time.Second},
				}
			},
		},
		{
			Name: "provider-outage",
			Description: "the provider answers 503 for a while: nothing is charged, the record is FAILED_RETRYABLE, " +
				"and the client's retry with the same key executes again with the same payment id and provider key",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 3, RoleReuser: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{ProviderFault(env, provider.Fault{Mode: provider.FaultFail}), 3 * time.Second}}
			},
		},
		{
			Name: "same-key-different-command",
			Description: "buggy clients reuse a key with a different amount once the first command answered: " +
				"409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST, and the second command never executes, even across a node crash",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleReuser: 2, RoleNormal: 1}},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillNode(r[0], 1), 2 * time.Second}}
			},
			Catches: []string{"raw-body-hash"},
		},
		{
			Name: "duplicate-without-key",
			Description: "a client without keys of its own resends the same payment (same merchant reference) with a fresh key: " +
				"the first executes, the others get 409 DUPLICATE_MERCHANT_REFERENCE naming it",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNoKey: 3, RoleNormal: 1}},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillNode(r[1], 1), 2 * time.Second}}
			},
		},
		{
			Name: "retry-after-expiry",
			Description: "with a 6s replay window, clients retry the same key after it has passed: a new operation by contract " +
				"(a new generation), which the merchant-reference constraint stops from paying twice (409 DUPLICATE_MERCHANT_REFERENCE)",
			ReplayWindow: 6 * time.Second,
			Workload:     WorkloadConfig{Mix: map[Role]int{RoleExpiry: 2, RoleNormal: 1}},
			ExtraClients: 6,
			Direct:       true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillNode(r[0], 0), 2 * time.Second}}
			},
		},
		{
			Name: "schema-deploy",
			Description: "a rolling deploy moves new answers from response schema v2 to v3 (replay-as-stored): retries of answers " +
				"written before the deploy replay the v2 bytes, from old and new nodes alike",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.8},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{RollingSchemaChange(env, "v3"), time.Second}}
			},
		},
		{
			Name: "service-hop",
			Description: "every first attempt lands outside the tenant's home region and is forwarded one hop; a home node's " +
				"ingress link is cut, then the WAN slows down: forwarded calls fail over or retry, and every answer is the home region's",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Away: true, Replays: 0.3},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{PartitionLink("->" + r[0] + "-0"), 3 * time.Second},
					{WANLatency(60*time.Millisecond, 30*time.Millisecond), 3 * time.Second},
				}
			},
		},
		{
			Name: "region-failover",
			Description: "a region is partitioned, its lease lapses, its tenants move to a survivor (routing.MoveRegion); retries reach " +
				"the new home, which asks the provider before charging; clients without keys resubmit within 4s; after the heal the old region's records are handed over",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 2}, Replays: 0.3, NoKeyDelay: 4 * time.Second},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{RegionFailover(env, r[0], r[1]), 2 * time.Second}}
			},
		},
		{
			Name: "region-failover-scale",
			Description: "region-failover with 10,000 idle tenants homed in the failing region besides the workload's: the failover " +
				"is still one etcd write (routing.MoveRegion), and every check of region-failover holds",
			Workload:    WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 2}, Replays: 0.3, NoKeyDelay: 4 * time.Second},
			IdleTenants: 10000,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{RegionFailover(env, r[0], r[1]), 2 * time.Second}}
			},
		},
		{
			Name: "region-auto-failover",
			Description: "the nodes run automatic failover (--auto-failover-after 500ms): a region's nodes are all killed, then " +
				"another region is cut off; each time the cluster moves the region's tenants to a survivor by itself, nobody acting, " +
				"within the region lease TTL + 4s; once a region is back its records are handed over",
			Regions: 3,
			// The targets name the default regions (r[1] = us-east takes
			// both); with other --regions the elected node's region does.
			NodeArgs: []string{"--auto-failover-after", "500ms", "--failover-targets", "eu-west=us-east,ap-south=us-east"},
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 1}, Replays: 0.3, NoKeyDelay: 4 * time.Second},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{RegionAutoFailover(env, r[0], false), 2 * time.Second},
					{RegionAutoFailover(env, r[2], true), 2 * time.Second},
				}
			},
		},
		{
			Name: "region-lost",
			Description: "a region is lost for good: its nodes are killed (SIGKILL) and never restarted, while its store still answers; " +
				"its tenants move to a survivor once its leases lapsed, clients whose node refuses go on to a live region, and the new home " +
				"takes over what the region left in its store (records, open ones recovered after their lock; unpublished events, " +
				"unconsumed deliveries, unsent receipts): nothing stays stuck and every effect happens once",
			Regions:  3,
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 1}, Replays: 0.3, NoKeyDelay: 4 * time.Second},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{RegionLost(env, r[0], r[1]), 2 * time.Second}}
			},
		},
		{
			Name: "region-lost-with-store",
			Description: "global store replicated over three regions (Patroni, synchronous and strict): the region holding the store's " +
				"primary is lost for good, its member of the store and its nodes killed and never restarted; the synchronous standby is " +
				"promoted, clients go on to the live regions, and nothing acknowledged is lost (in region-local mode the same loss loses " +
				"what only that region's store held: idemctl drill reports it)",
			Regions:      3,
			StoreMode:    "global",
			StoreHA:      true,
			NodeArgs:     storeHANodeArgs,
			Workload:     WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 1}, Replays: 0.3},
			ExtraClients: 8,
			Direct:       true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{RegionLostWithStore(env), 2 * time.Second}}
			},
		},
		{
			Name: "partition-region",
			Description: "a region loses every link (store, etcd, provider, forwarded requests) for longer than its lease and comes back, " +
				"without a failover: it stops serving on its own, and its keys are answered consistently once it is back",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.3},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{PartitionRegion(r[0]), chaosLeaseTTL + 2*time.Second}}
			},
		},
		{
			Name: "partition-one-way",
			Description: "an asymmetric partition at the network layer (docker environment): a region opens no connection to anything " +
				"beyond its network (etcd, the store, the provider, the other regions) while connections into it still work; it stops " +
				"serving on its own, forwarded requests into it fail cleanly, and its keys are answered consistently once it is back",
			Workload:   WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.3},
			DockerOnly: true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{OneWayPartition(r[0]), chaosLeaseTTL + 2*time.Second}}
			},
		},
		{
			Name: "store-unavailable",
			Description: "a region's nodes lose their store for a while: 503 STORE_UNAVAILABLE, nothing half-done is left behind, " +
				"retries succeed once it is back",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{StoreUnavailable(r[0]), 3 * time.Second}}
			},
		},
		{
			Name: "pgbouncer-restart",
			Description: "every node reaches its store through PgBouncer in transaction pooling, which is killed (SIGKILL) mid-traffic " +
				"four times and restarted after a short pause, twice while the server holds commits in flight (as an fsync or a " +
				"synchronous standby would), which it then carries out with their clients gone: ambiguous commits through a pooler, " +
				"resolved (a claim by its id, a fenced write by reading it back), never run twice, nothing acknowledged lost",
			PgBouncer: true,
			Workload:  WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleRacer: 1, RoleNoKey: 1}, RaceWidth: 2, Replays: 0.3},
			Direct:    true,
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{KillPgBouncer(), time.Second},
					{KillPgBouncerMidCommit(time.Second), 2 * time.Second},
					{KillPgBouncer(), 500 * time.Millisecond},
					{KillPgBouncerMidCommit(time.Second), time.Second},
				}
			},
		},
		{
			Name:        "kill-region",
			Description: "every node of a region crashes at once (SIGKILL) and restarts; then one node crashes on its own",
			Workload:    WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{KillRegion(r[1]), 2 * time.Second}, {KillNode(r[0], 0), time.Second}}
			},
		},
		{
			Name: "pause-node",
			Description: "a node is frozen (SIGSTOP) longer than its lease, mid-request, then resumed (SIGCONT): it stops serving " +
				"on its own local deadline, and its in-flight owners are fenced",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{PauseNode(r[0], 0), chaosLeaseTTL + 2*time.Second}}
			},
		},
		{
			Name: "stale-owner",
			Description: "owners are held at their provider call (failpoint) and frozen (SIGSTOP) past their lock and lease; other owners " +
				"take the payments over and finish them; the stale owners then wake while the provider fails, and the store refuses their writes (fencing)",
			Workload:     WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.3},
			ExtraClients: 6,
			Faults: func(env *Env, r []string) []Step {
				return []Step{{StaleOwner(env, r[0], 0, 10*time.Second, 6*time.Second), 4 * time.Second}}
			},
			Catches: []string{"no-fencing"},
		},
		{
			Name: "etcd-faults",
			Description: "an etcd member crashes, then the etcd leader, then a node loses its link to one member: " +
				"leases, placements and recovery locks keep working through a quorum",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{KillEtcdMember(2), 2 * time.Second},
					{KillEtcdLeader(), 3 * time.Second},
					{PartitionNodeEtcd(r[0], 0, 0), 3 * time.Second},
				}
			},
		},
		{
			Name: "clock-skew",
			Description: "nodes run with their wall clock 45s ahead or behind (IDEM_CLOCK_SKEW): record times come from the store's " +
				"clock and leases from local monotonic deadlines, so nothing expires early or lives late",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.4},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{ClockSkew(env, r[0], 0, 45*time.Second), 3 * time.Second},
					{ClockSkew(env, r[1], 1, -45*time.Second), 3 * time.Second},
				}
			},
		},
		{
			Name: "sidecar-cross-region",
			Description: "idemd as a sidecar in front of a plain upstream (--proxy-routes with a lookup): each transfer's first attempt goes to " +
				"every region at once; the upstream loses answers after executing, then nodes crash; the upstream executes each derived key once " +
				"and every 2xx answer of a key is the same bytes",
			Sidecar:  true,
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}},
			Faults:   sidecarFaults,
		},
		{
			Name: "sidecar-cross-region-form",
			Description: "sidecar-cross-region with form-encoded transfers (application/x-www-form-urlencoded, as payment SDKs send them): " +
				"every retry sends the fields in another order, spaces as + or %20, which is the same command, so it is answered as one " +
				"(a replay, never 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST); the same faults and checks",
			Sidecar:     true,
			SidecarForm: true,
			Workload:    WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}},
			Faults:      sidecarFaults,
		},
		{
			Name: "grpc-kill",
			Description: "grpc-go clients with a retry policy (UNAVAILABLE, ABORTED) call Transfers/Create, made idempotent with idemgrpc, " +
				"round robin over two gRPC nodes on one store; each node is killed (SIGKILL) with calls in flight, between their side " +
				"effect and their answer, and restarted: retries reach the other node, wait out the dead owner's lock, and get the " +
				"answer recovery finds (the effect row), so each key executes once and every answer of a key is the same",
			GRPC:     true,
			Direct:   true,
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}, Replays: 0.2},
			Faults: func(env *Env, r []string) []Step {
				return []Step{
					{KillGRPCNode(env, 0), 2 * time.Second},
					{KillGRPCNode(env, 1), 2 * time.Second},
				}
			},
		},
		{
			Name: "duplicate-delivery",
			Description: "every node delivers each outbox event twice (--duplicate-delivery): the ledger and receipt-email consumers " +
				"deduplicate by message id, one entry and one email per payment",
			Workload: WorkloadConfig{Mix: map[Role]int{RoleNormal: 1}},
			Faults: func(env *Env, r []string) []Step {
				return []Step{{DuplicateDelivery(env), 4 * time.Second}}
			},
		},
	}
}

// ScenarioNames returns the catalogue's names in order.
func ScenarioNames() []string {
	var out []string
	for _, s := range Catalogue() {
		out = append(out, s.Name)
	}
	return out
}

// Lookup returns the scenario called name.
func Lookup(name string) (Scenario, error) {
	for _, s := range Catalogue() {
		if s.Name == name {
			return s, nil
		}
	}
	return Scenario{}, fmt.Errorf("chaos: no scenario %q (have: %s)", name, strings.Join(ScenarioNames(), ", "))
}

// Environments a scenario runs in (Options.Env).
const (
	// EnvProcess runs every process of the cluster on this machine, its
	// links through toxiproxy in the harness (the default).
	EnvProcess = "process"
	// EnvDocker runs them in containers, a network per region joined
	// through a WAN container (cluster.Config.Docker), and cuts regions at
	// the network layer.
	EnvDocker = "docker"
)

// Envs returns the environments, the default first.
func Envs() []string { return []string{EnvProcess, EnvDocker} }

// RunsIn reports whether s runs in env, and if not, why.
func (s Scenario) RunsIn(env string) (bool, string) {
	switch {
	case env == EnvDocker && s.StoreHA:
		return false, "the replicated store (Patroni) runs in the process environment only"
	case env == EnvDocker && s.PgBouncer:
		return false, "PgBouncer runs in the process environment only"
	case env == EnvDocker && s.Sidecar:
		return false, "the sidecar's upstream runs in the harness, out of the containers' reach"
	case env == EnvDocker && s.GRPC:
		return false, "the gRPC nodes run beside the harness, in the process environment only"
	case env != EnvDocker && s.DockerOnly:
		return false, "its partition is at the network layer of the docker environment (--env docker)"
	}
	return true, ""
}

// BreakModes returns the deliberately broken engine modes idemd accepts
// with --break.
func BreakModes() []string { return []string{"find-then-insert", "no-fencing", "raw-body-hash"} }

// ScenarioFor returns the scenario that catches break mode b.
func ScenarioFor(b string) (Scenario, error) {
	name := map[string]string{
		"find-then-insert": "concurrent-retry",
		"no-fencing":       "stale-owner",
		"raw-body-hash":    "completed-replay",
	}[b]
	if name == "" || !slices.Contains(BreakModes(), b) {
		return Scenario{}, fmt.Errorf("chaos: unknown break mode %q (want %s)", b, strings.Join(BreakModes(), ", "))
	}
	return Lookup(name)
}

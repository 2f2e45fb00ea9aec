package chaos

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/failover"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/routing"
)

// Fault is one failure the harness injects into a running cluster and
// later heals, like a failpoint of etcd's robustness tests. Inject and Heal
// are called once each, in that order, from one goroutine; the harness
// checks the cluster's health before Inject and after Heal.
type Fault interface {
	// Name identifies the fault in reports ("partition-region(eu-west)").
	Name() string
	// Available reports whether the fault can run on c (a network fault
	// needs a proxied cluster, an etcd fault needs etcd, ...).
	Available(c *cluster.Cluster) bool
	// Inject starts the failure.
	Inject(ctx context.Context, c *cluster.Cluster) error
	// Heal ends it, leaving the cluster able to become healthy again.
	Heal(ctx context.Context, c *cluster.Cluster) error
}

// Noter is implemented by faults that have something to add to the
// report's timeline (which member was the leader, what a handover copied).
type Noter interface {
	Notes() []string
}

// Env is what faults use besides the cluster: the node overrides, the
// provider's admin API and the cluster's lease TTL.
type Env struct {
	Cluster *cluster.Cluster
	// Provider is the provider simulator's client (nil without one).
	Provider *provider.Client
	// LeaseTTL is the nodes' --region-lease-ttl.
	LeaseTTL time.Duration
	nodes    *nodeControl
	log      *slog.Logger
	// sidecar is the sidecar scenario's upstream (nil otherwise).
	sidecar *sidecarUpstream
	// grpc and grpcTraffic are the gRPC scenario's nodes and traffic (nil
	// otherwise).
	grpc        *grpcNodes
	grpcTraffic *grpcTraffic
	// failedOver is set once a region failover moved tenants: a key may
	// then be executed again (with the same answer) by the new home.
	mu         sync.Mutex
	failedOver bool
	// lost names the regions lost for good (RegionLost): their nodes are
	// never restarted, and health checks leave them out.
	lost map[string]bool
}

// markLost records that region's nodes are gone for good.
func (e *Env) markLost(region string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lost == nil {
		e.lost = map[string]bool{}
	}
	e.lost[region] = true
}

// Lost reports whether region was lost for good in this run.
func (e *Env) Lost(region string) bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lost[region]
}

func (e *Env) setFailedOver() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failedOver = true
}

// FailedOver reports whether a region failover moved tenants in this run.
func (e *Env) FailedOver() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failedOver
}

// notes is embedded by faults that keep notes.
type notes struct {
	mu sync.Mutex
	n  []string
}

func (n *notes) note(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.n = append(n.n, fmt.Sprintf(format, args...))
}

// Notes returns what the fault noted.
func (n *notes) Notes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.n)
}

func proxied(c *cluster.Cluster) bool { return len(c.Links()) > 0 }

func hasRegion(c *cluster.Cluster, region string) bool { return c.Node(region, 0) != nil }

func regionNodes(c *cluster.Cluster, region string) []*cluster.Process {
	var out []*cluster.Process
	for _, p := range c.Nodes() {
		if p.Region() == region {
			out = append(out, p)
		}
	}
	return out
}

// --- network ---

type partitionRegion struct {
	region string
	links  []string
}

// PartitionRegion cuts every link of a region's nodes, both ways: to the
// store, to etcd, to the provider, and forwarded requests into the region.
// Clients still reach the region's nodes directly, and get 503s. In the
// docker environment the cut is at the network layer
// (cluster.IsolateRegion): the region's network loses the WAN, its etcd
// member included, and open connections go silent instead of closing.
func PartitionRegion(region string) Fault { return &partitionRegion{region: region} }

func (f *partitionRegion) Name() string { return "partition-region(" + f.region + ")" }
func (f *partitionRegion) Available(c *cluster.Cluster) bool {
	return proxied(c) && hasRegion(c, f.region)
}
func (f *partitionRegion) Inject(ctx context.Context, c *cluster.Cluster) error {
	var err error
	f.links, err = cutRegion(ctx, c, f.region)
	return err
}
func (f *partitionRegion) Heal(ctx context.Context, c *cluster.Cluster) error {
	return rejoinRegion(ctx, c, f.region, f.links)
}

// cutRegion partitions region: its links (process environment) or its
// network (docker environment). It returns the links cut, if any.
func cutRegion(ctx context.Context, c *cluster.Cluster, region string) ([]string, error) {
	if c.Docker() {
		return nil, c.IsolateRegion(ctx, region)
	}
	links := c.LinksOf(region)
	return links, c.Partition(links...)
}

// rejoinRegion undoes cutRegion.
func rejoinRegion(ctx context.Context, c *cluster.Cluster, region string, links []string) error {
	if c.Docker() {
		return c.RejoinRegion(ctx, region)
	}
	return c.Heal(links...)
}

type oneWayPartition struct{ region string }

// OneWayPartition is an asymmetric partition (docker environment only): the
// region cannot open a connection to anything beyond its network (etcd
// peers, the store, the provider, other regions' nodes), while connections
// opened into it still work (cluster.CutOutbound).
func OneWayPartition(region string) Fault { return &oneWayPartition{region: region} }

func (f *oneWayPartition) Name() string { return "one-way-partition(" + f.region + " reaches nobody)" }
func (f *oneWayPartition) Available(c *cluster.Cluster) bool {
	return c.Docker() && hasRegion(c, f.region)
}
func (f *oneWayPartition) Inject(ctx context.Context, c *cluster.Cluster) error {
	return c.CutOutbound(ctx, f.region, true)
}
func (f *oneWayPartition) Heal(ctx context.Context, c *cluster.Cluster) error {
	return c.CutOutbound(ctx, f.region, false)
}

type partitionLink struct {
	pick func(c *cluster.Cluster) string
	desc string
	link string
}

// PartitionLink cuts one link, named as by cluster.Link ("eu-west-0->etcd-m1").
func PartitionLink(name string) Fault {
	return &partitionLink{pick: func(*cluster.Cluster) string { return name }, desc: name}
}

// PartitionNodeEtcd cuts the link from a node to one etcd member.
func PartitionNodeEtcd(region string, node, member int) Fault {
	name := fmt.Sprintf("%s-%d->etcd-m%d", region, node, member)
	return PartitionLink(name)
}

func (f *partitionLink) Name() string { return "partition-link(" + f.desc + ")" }
func (f *partitionLink) Available(c *cluster.Cluster) bool {
	name := f.pick(c)
	return slices.ContainsFunc(c.Links(), func(l cluster.Link) bool { return l.Name == name })
}
func (f *partitionLink) Inject(_ context.Context, c *cluster.Cluster) error {
	f.link = f.pick(c)
	return c.Partition(f.link)
}
func (f *partitionLink) Heal(_ context.Context, c *cluster.Cluster) error { return c.Heal(f.link) }

type wanLatency struct {
	latency, jitter time.Duration
	links           []string
}

// WANLatency delays every link between regions: the links into each node
// (requests forwarded from another region) and the etcd members' peer
// links, by latency ± jitter each way.
func WANLatency(latency, jitter time.Duration) Fault {
	return &wanLatency{latency: latency, jitter: jitter}
}

func (f *wanLatency) Name() string {
	return fmt.Sprintf("wan-latency(%v±%v)", f.latency, f.jitter)
}
func (f *wanLatency) Available(c *cluster.Cluster) bool { return proxied(c) && len(c.Nodes()) > 1 }
func (f *wanLatency) Inject(_ context.Context, c *cluster.Cluster) error {
	f.links = nil
	for _, l := range c.Links() {
		ingress := l.From == ""
		peer := strings.HasPrefix(l.From, "etcd-") && strings.HasPrefix(l.To, "etcd-")
		if ingress || peer {
			f.links = append(f.links, l.Name)
		}
	}
	for _, l := range f.links {
		if err := c.AddLatency(l, f.latency, f.jitter); err != nil {
			return err
		}
	}
	return nil
}
func (f *wanLatency) Heal(_ context.Context, c *cluster.Cluster) error {
	return c.RemoveToxics(f.links...)
}

type storeUnavailable struct {
	region string
	links  []string
}

// StoreUnavailable cuts the links from a region's nodes to its store.
func StoreUnavailable(region string) Fault { return &storeUnavailable{region: region} }

func (f *storeUnavailable) Name() string { return "store-unavailable(" + f.region + ")" }
func (f *storeUnavailable) Available(c *cluster.Cluster) bool {
	return proxied(c) && hasRegion(c, f.region)
}
func (f *storeUnavailable) Inject(_ context.Context, c *cluster.Cluster) error {
	f.links = nil
	for _, p := range regionNodes(c, f.region) {
		f.links = append(f.links, p.Name()+"->"+cluster.EndpointStore)
	}
	return c.Partition(f.links...)
}
func (f *storeUnavailable) Heal(_ context.Context, c *cluster.Cluster) error {
	return c.Heal(f.links...)
}

// --- processes ---

type killNodes struct {
	name  string
	pick  func(c *cluster.Cluster) []*cluster.Process
	procs []*cluster.Process
}

// KillNode kills node i of region with SIGKILL (a crash) and restarts it
// at Heal.
func KillNode(region string, i int) Fault {
	return &killNodes{name: fmt.Sprintf("kill-node(%s-%d)", region, i), pick: func(c *cluster.Cluster) []*cluster.Process {
		if p := c.Node(region, i); p != nil {
			return []*cluster.Process{p}
		}
		return nil
	}}
}

// KillRegion kills every node of region at once and restarts them at Heal.
func KillRegion(region string) Fault {
	return &killNodes{name: "kill-region(" + region + ")", pick: func(c *cluster.Cluster) []*cluster.Process {
		return regionNodes(c, region)
	}}
}

// KillEtcdMember kills etcd member i and restarts it (with its data) at
// Heal.
func KillEtcdMember(i int) Fault {
	return &killNodes{name: fmt.Sprintf("kill-etcd-member(m%d)", i), pick: func(c *cluster.Cluster) []*cluster.Process {
		if p := c.EtcdMember(i); p != nil {
			return []*cluster.Process{p}
		}
		return nil
	}}
}

func (f *killNodes) Name() string                      { return f.name }
func (f *killNodes) Available(c *cluster.Cluster) bool { return len(f.pick(c)) > 0 }
func (f *killNodes) Inject(_ context.Context, c *cluster.Cluster) error {
	f.procs = f.pick(c)
	var errs []error
	for _, p := range f.procs {
		errs = append(errs, p.Kill())
	}
	return errors.Join(errs...)
}
func (f *killNodes) Heal(ctx context.Context, _ *cluster.Cluster) error {
	return restartAll(ctx, f.procs)
}

// restartAll restarts procs concurrently.
func restartAll(ctx context.Context, procs []*cluster.Process) error {
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.Restart(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

type killEtcdLeader struct {
	notes
	leader *cluster.Process
}

// KillEtcdLeader kills the member leading the etcd cluster and restarts it
// at Heal.
func KillEtcdLeader() Fault { return &killEtcdLeader{} }

func (f *killEtcdLeader) Name() string                      { return "kill-etcd-leader" }
func (f *killEtcdLeader) Available(c *cluster.Cluster) bool { return len(c.EtcdMembers()) > 1 }
func (f *killEtcdLeader) Inject(ctx context.Context, c *cluster.Cluster) error {
	l, err := c.EtcdLeader(ctx)
	if err != nil {
		return err
	}
	f.leader = l
	f.note("leader was %s", l.Name())
	return l.Kill()
}
func (f *killEtcdLeader) Heal(ctx context.Context, _ *cluster.Cluster) error {
	if f.leader == nil {
		return nil
	}
	return f.leader.Restart(ctx)
}

type pauseNode struct {
	region string
	i      int
	p      *cluster.Process
}

// PauseNode stops node i of region with SIGSTOP and resumes it with
// SIGCONT at Heal; held longer than the lease TTL, the node's lease runs
// out while it is frozen mid-request.
func PauseNode(region string, i int) Fault { return &pauseNode{region: region, i: i} }

func (f *pauseNode) Name() string                      { return fmt.Sprintf("pause-node(%s-%d)", f.region, f.i) }
func (f *pauseNode) Available(c *cluster.Cluster) bool { return c.Node(f.region, f.i) != nil }
func (f *pauseNode) Inject(_ context.Context, c *cluster.Cluster) error {
	f.p = c.Node(f.region, f.i)
	return f.p.Signal(syscall.SIGSTOP)
}
func (f *pauseNode) Heal(_ context.Context, _ *cluster.Cluster) error {
	return f.p.Signal(syscall.SIGCONT)
}

// --- node configuration (restarts through the overrides) ---

type restartWith struct {
	name   string
	env    *Env
	pick   func(c *cluster.Cluster) []*cluster.Process
	add    func(args, env []string) ([]string, []string)
	remove func(args, env []string) ([]string, []string)
	procs  []*cluster.Process
}

func (f *restartWith) Name() string { return f.name }
func (f *restartWith) Available(c *cluster.Cluster) bool {
	return f.env != nil && f.env.nodes != nil && len(f.pick(c)) > 0
}
func (f *restartWith) Inject(ctx context.Context, c *cluster.Cluster) error {
	f.procs = f.pick(c)
	return f.rolling(ctx, f.add)
}
func (f *restartWith) Heal(ctx context.Context, _ *cluster.Cluster) error {
	if f.remove == nil {
		return nil
	}
	return f.rolling(ctx, f.remove)
}

// rolling restarts the nodes one at a time with changed overrides.
func (f *restartWith) rolling(ctx context.Context, change func(args, env []string) ([]string, []string)) error {
	for _, p := range f.procs {
		args, env := f.env.nodes.overrides(p.Name())
		args, env = change(args, env)
		if err := f.env.nodes.restartWith(ctx, p, args, env); err != nil {
			return err
		}
	}
	return nil
}

func withEnv(key, value string) func(args, env []string) ([]string, []string) {
	return func(args, env []string) ([]string, []string) {
		_, env = withoutEnv(key)(args, env)
		return args, append(env, key+"="+value)
	}
}

func withoutEnv(key string) func(args, env []string) ([]string, []string) {
	return func(args, env []string) ([]string, []string) {
		return args, slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
	}
}

func withFlag(flag string, value ...string) func(args, env []string) ([]string, []string) {
	return func(args, env []string) ([]string, []string) {
		args, _ = withoutFlag(flag, len(value))(args, env)
		return append(append(args, flag), value...), env
	}
}

func withoutFlag(flag string, values int) func(args, env []string) ([]string, []string) {
	return func(args, env []string) ([]string, []string) {
		var out []string
		for i := 0; i < len(args); i++ {
			if args[i] == flag {
				i += values
				continue
			}
			out = append(out, args[i])
		}
		return out, env
	}
}

func oneNode(region string, i int) func(c *cluster.Cluster) []*cluster.Process {
	return func(c *cluster.Cluster) []*cluster.Process {
		if p := c.Node(region, i); p != nil {
			return []*cluster.Process{p}
		}
		return nil
	}
}

func allNodes(c *cluster.Cluster) []*cluster.Process { return c.Nodes() }

// ClockSkew restarts node i of region with its wall clock offset by skew
// (IDEM_CLOCK_SKEW) and restarts it without at Heal.
func ClockSkew(env *Env, region string, i int, skew time.Duration) Fault {
	return &restartWith{
		name: fmt.Sprintf("clock-skew(%s-%d,%v)", region, i, skew), env: env, pick: oneNode(region, i),
		add: withEnv("IDEM_CLOCK_SKEW", skew.String()), remove: withoutEnv("IDEM_CLOCK_SKEW"),
	}
}

// DuplicateDelivery restarts every node, one at a time, with
// --duplicate-delivery (every outbox event delivered twice), and without it
// at Heal.
func DuplicateDelivery(env *Env) Fault {
	return &restartWith{
		name: "duplicate-delivery", env: env, pick: allNodes,
		add: withFlag("--duplicate-delivery"), remove: withoutFlag("--duplicate-delivery", 0),
	}
}

// RollingSchemaChange restarts every node, one at a time, with
// --response-schema to: a deploy that changes the response schema. It is
// not undone at Heal; replays of answers written before must stay byte for
// byte what they were (replay-as-stored).
func RollingSchemaChange(env *Env, to string) Fault {
	return &restartWith{
		name: "rolling-schema-change(" + to + ")", env: env, pick: allNodes,
		add: withFlag("--response-schema", to),
	}
}

// NodeFailpoint restarts node i of region with IDEM_FAILPOINTS=spec and
// without at Heal.
func NodeFailpoint(env *Env, region string, i int, spec string) Fault {
	return &restartWith{
		name: fmt.Sprintf("failpoint(%s-%d,%s)", region, i, spec), env: env, pick: oneNode(region, i),
		add: withEnv("IDEM_FAILPOINTS", spec), remove: withoutEnv("IDEM_FAILPOINTS"),
	}
}

// --- provider ---

type providerFault struct {
	env   *Env
	fault provider.Fault
}

// ProviderFault switches the provider simulator's fault on (fail: 503,
// slow: answers after a delay, lose-answer: charges, then drops the
// connection) and off at Heal.
func ProviderFault(env *Env, f provider.Fault) Fault { return &providerFault{env: env, fault: f} }

func (f *providerFault) Name() string {
	s := "provider-" + string(f.fault.Mode)
	if f.fault.Mode == provider.FaultSlow {
		s += "(" + f.fault.Delay.String() + ")"
	}
	return s
}
func (f *providerFault) Available(c *cluster.Cluster) bool {
	return f.env != nil && f.env.Provider != nil && c.ProviderURL() != ""
}
func (f *providerFault) Inject(ctx context.Context, _ *cluster.Cluster) error {
	return f.env.Provider.SetFault(ctx, f.fault)
}
func (f *providerFault) Heal(ctx context.Context, _ *cluster.Cluster) error {
	return f.env.Provider.SetFault(ctx, provider.Fault{Mode: provider.FaultNone})
}

// --- region failover ---

type regionFailover struct {
	notes
	env      *Env
	from, to string
	links    []string
	moved    *routing.RegionMove
	// elected: etcd elected a leader between the cut and the move.
	elected bool
	// cutAt is when the partition took effect.
	cutAt time.Time
}

// RegionFailover partitions region from, waits until etcd holds no live
// node of it (its leases lapsed), and moves its tenants to region to
// (routing.MoveRegion, as "idemctl region failover" does). Heal restores
// the links, waits for from's nodes, and hands from's records of the moved
// tenants over to to (store.Handover, as "idemctl region handover").
func RegionFailover(env *Env, from, to string) Fault {
	return &regionFailover{env: env, from: from, to: to}
}

func (f *regionFailover) Name() string { return "region-failover(" + f.from + "→" + f.to + ")" }

// CutAt is when the region was cut off: the drill measures its RTO from
// then (in the docker environment the cut is a few commands after the
// fault's start).
func (f *regionFailover) CutAt() time.Time { return f.cutAt }

// EtcdElected reports whether etcd elected a leader between the cut and the
// move (the drill's RTO bound then allows for the election and the leases
// it extends).
func (f *regionFailover) EtcdElected() bool { return f.elected }
func (f *regionFailover) Available(c *cluster.Cluster) bool {
	return proxied(c) && c.EtcdClient() != nil && hasRegion(c, f.from) && hasRegion(c, f.to) &&
		c.StoreMode() == cluster.StoreRegionLocal
}

func (f *regionFailover) Inject(ctx context.Context, c *cluster.Cluster) error {
	// etcd's raft term before the cut: a higher one once the region has no
	// live node means etcd elected a leader meanwhile. That happens when
	// the failed region held the leader (the docker environment puts a
	// member in each region), or when a member missed the leader's
	// heartbeats for an election timeout under load; either way the new
	// leader extends every lease by one election timeout.
	termBefore, termErr := f.etcdTerm(ctx, c)
	if c.Docker() {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		leader, err := c.EtcdLeader(lctx)
		cancel()
		if err == nil && leader.Region() == f.from {
			f.note("the etcd leader (%s) is in %s and is cut off with it: etcd elects another first", leader.Name(), f.from)
		}
	}
	// Read before the cut: after it, a read that reaches the cut-off
	// member waits for etcd's request timeout (7s) before it goes to
	// another, and would hold the failover back by as much.
	before, err := c.EtcdClient().Get(ctx, routing.PlacementPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("chaos: placements before the failover: %w", err)
	}
	if f.links, err = cutRegion(ctx, c, f.from); err != nil {
		return err
	}
	began := time.Now()
	f.cutAt = began
	moved, err := failover.Move(ctx, c.EtcdClient(), f.from, f.to, 3*f.env.LeaseTTL+15*time.Second, nil)
	if err != nil {
		return fmt.Errorf("chaos: region %s: %w", f.from, err)
	}
	f.note("%s had no live node %v after the partition", f.from, time.Since(began).Round(100*time.Millisecond))
	if termAfter, err := f.etcdTerm(ctx, c); termErr == nil && err == nil && termAfter > termBefore {
		f.elected = true
		f.note("etcd elected a leader meanwhile (raft term %d -> %d): the new leader extended every lease by an election timeout", termBefore, termAfter)
	}
	f.moved = &moved
	revs, keys, err := placementWrites(ctx, c.EtcdClient(), before.Header.Revision)
	if err != nil {
		return err
	}
	f.note("moved %s's tenants to %s (epoch %d): the failover wrote %d etcd revision(s), %d key(s), under %s and %s; %d tenant(s) have a placement of their own",
		f.from, f.to, moved.Epoch, revs, keys, "/idem/placement/", routing.FailoverPrefix, before.Count)
	f.env.setFailedOver()
	return nil
}

// etcdTerm is c.EtcdTerm within a few seconds.
func (f *regionFailover) etcdTerm(ctx context.Context, c *cluster.Cluster) (uint64, error) {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.EtcdTerm(tctx)
}

func (f *regionFailover) Heal(ctx context.Context, c *cluster.Cluster) error {
	if err := rejoinRegion(ctx, c, f.from, f.links); err != nil {
		return err
	}
	for _, p := range regionNodes(c, f.from) {
		if err := p.WaitReady(ctx); err != nil {
			return err
		}
	}
	if f.moved == nil {
		return nil
	}
	return handover(ctx, c, f.from, f.to, &f.notes)
}

// handover hands from's records of the tenants moved to to over to to's
// store (failover.Handover, as "idemctl region handover"), noting what it
// copied.
func handover(ctx context.Context, c *cluster.Cluster, from, to string, n *notes) error {
	var fromURL, toURL string
	for _, r := range c.Info().Regions {
		switch r.Name {
		case from:
			fromURL = r.DatabaseURL
		case to:
			toURL = r.DatabaseURL
		}
	}
	rep, err := failover.HandoverURLs(ctx, c.EtcdClient(), from, to,
		failover.Stores{From: fromURL, To: toURL, Effects: c.Info().EffectsDatabaseURL})
	noteHandover(n, rep)
	if err != nil {
		return fmt.Errorf("chaos: handover %s -> %s: %w", from, to, err)
	}
	return nil
}

// noteHandover notes what a handover did: each tenant that had records or
// payments to hand over, and how many tenants had none (the idle tenants of
// a large placement map).
func noteHandover(n *notes, rep failover.Report) {
	empty := 0
	for _, t := range rep.Tenants {
		if t.Records == 0 && t.Rows == 0 && len(t.Conflicts) == 0 {
			empty++
			continue
		}
		n.note("handover %s: %d records read, %d copied, %d identical, %d rows copied, %d conflicts",
			t.Tenant, t.Records, t.Copied, t.Identical, t.Rows, len(t.Conflicts))
		for i, cf := range t.Conflicts {
			if i == 5 {
				n.note("… %d more conflicts", len(t.Conflicts)-5)
				break
			}
			n.note("handover conflict %s/%s: %s (%s here, %s there)", cf.Scope.Tenant, cf.Scope.Key, cf.Reason, cf.From, cf.To)
		}
	}
	if empty > 0 {
		n.note("handover: %d more tenant(s) had nothing to hand over", empty)
	}
	o := rep.Outbox
	if o.Before != (outbox.Backlog{}) || o.Left != (outbox.Backlog{}) {
		n.note("handover: the old store's outbox held %d unpublished event(s), %d pending delivery(ies), %d unsent receipt(s) (%d under a sender's claim); taken over: %d published, %d consumed, %d sent; left %d, %d, %d (%d under a claim)",
			o.Before.Unpublished, o.Before.Pending, o.Before.Unsent, o.Before.Leased,
			o.Published, o.Consumed.Processed+o.Consumed.Duplicates+o.Consumed.Rejected, o.Sent,
			o.Left.Unpublished, o.Left.Pending, o.Left.Unsent, o.Left.Leased)
	}
}

// placementWrites counts the distinct revisions, and the keys, written
// after revision after under the placement and tenant failover prefixes:
// what a failover wrote besides locks and registrations.
func placementWrites(ctx context.Context, cli *clientv3.Client, after int64) (revs, keys int, err error) {
	seen := map[int64]bool{}
	for _, prefix := range []string{"/idem/placement/", routing.FailoverPrefix} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithMinModRev(after+1), clientv3.WithKeysOnly())
		if err != nil {
			return 0, 0, fmt.Errorf("chaos: writes of the failover: %w", err)
		}
		for _, kv := range resp.Kvs {
			seen[kv.ModRevision] = true
			keys++
		}
	}
	return len(seen), keys, nil
}

// placeIdleTenants gives n idle tenants ("idle-<i>") a placement of their
// own in region, txnOps puts per etcd transaction.
func placeIdleTenants(ctx context.Context, cli *clientv3.Client, region string, n int) error {
	val, err := json.Marshal(map[string]string{"region": region})
	if err != nil {
		return err
	}
	const txnOps = 128 // etcd's default --max-txn-ops
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("chaos: place idle tenants: %w", err)
		}
		ops = ops[:0]
		return nil
	}
	for i := range n {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sidle-%06d", routing.PlacementPrefix, i), string(val)))
		if len(ops) == txnOps {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// --- a stale owner (fencing) ---

type staleOwner struct {
	notes
	env    *Env
	region string
	i      int
	sleep  time.Duration
	pause  time.Duration
	p      *cluster.Process
}

// StaleOwner makes node i of region an owner that outlives its ownership:
// it restarts the node with a failpoint that holds every owner of a payment
// for sleep just before its provider call (IDEM_FAILPOINTS
// before-provider-call and recovery-before-provider-call), then freezes the
// node with SIGSTOP for pause while it holds such payments, so that its
// record locks and its etcd lease lapse and another owner takes the
// payments over and finishes them. Then the provider starts failing (503)
// and the node is resumed (SIGCONT): its owners wake up, their charges
// fail, and they try to record that failure over the finished payments
// with their stale fencing tokens, which the store must refuse (a stale
// owner that is not refused turns a COMPLETED record back into
// FAILED_RETRYABLE, and a later retry executes it again). Heal ends the
// provider's failure, lets the remaining owners wake and restarts the node
// without the failpoint.
func StaleOwner(env *Env, region string, i int, sleep, pause time.Duration) Fault {
	return &staleOwner{env: env, region: region, i: i, sleep: sleep, pause: pause}
}

func (f *staleOwner) Name() string { return fmt.Sprintf("stale-owner(%s-%d)", f.region, f.i) }
func (f *staleOwner) Available(c *cluster.Cluster) bool {
	return f.env != nil && f.env.nodes != nil && c.Node(f.region, f.i) != nil && c.ProviderURL() != ""
}

func (f *staleOwner) spec() string {
	return fmt.Sprintf("before-provider-call=20*sleep(%s);recovery-before-provider-call=4*sleep(%s)", f.sleep, f.sleep)
}

func (f *staleOwner) Inject(ctx context.Context, c *cluster.Cluster) error {
	f.p = c.Node(f.region, f.i)
	args, env := f.env.nodes.overrides(f.p.Name())
	args, env = withEnv("IDEM_FAILPOINTS", f.spec())(args, env)
	if err := f.env.nodes.restartWith(ctx, f.p, args, env); err != nil {
		return err
	}
	// Let owners pile up at the failpoint, then freeze the node with them.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.sleep / 2):
	}
	if err := f.p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	f.note("%s frozen with SIGSTOP for %v, holding owners at the failpoint", f.p.Name(), f.pause)
	select {
	case <-ctx.Done():
		_ = f.p.Signal(syscall.SIGCONT)
		return ctx.Err()
	case <-time.After(f.pause):
	}
	if f.env.Provider != nil {
		if err := f.env.Provider.SetFault(ctx, provider.Fault{Mode: provider.FaultFail}); err != nil {
			_ = f.p.Signal(syscall.SIGCONT)
			return err
		}
		f.note("provider failing (503) while %s's owners wake up", f.p.Name())
	}
	return f.p.Signal(syscall.SIGCONT)
}

func (f *staleOwner) Heal(ctx context.Context, _ *cluster.Cluster) error {
	if f.p == nil {
		return nil
	}
	_ = f.p.Signal(syscall.SIGCONT)
	var errs []error
	if f.env.Provider != nil {
		errs = append(errs, f.env.Provider.SetFault(ctx, provider.Fault{Mode: provider.FaultNone}))
	}
	// Give the remaining owners time to act before the restart.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.sleep / 2):
	}
	args, env := f.env.nodes.overrides(f.p.Name())
	args, env = withoutEnv("IDEM_FAILPOINTS")(args, env)
	errs = append(errs, f.env.nodes.restartWith(ctx, f.p, args, env))
	return errors.Join(errs...)
}

// providerClient returns a client of the provider simulator at url that
// sends adminKey to its /admin endpoints (faults, charge counts), trusting
// tlsConfig's roots (nil: plain HTTP).
func providerClient(url, adminKey string, tlsConfig *tls.Config) *provider.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig
	return &provider.Client{BaseURL: url, AdminKey: adminKey, HTTP: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

type crashMidRequest struct {
	notes
	env    *Env
	region string
	i      int
	point  string
	sleep  time.Duration
	p      *cluster.Process
}

// CrashMidRequest restarts node i of region with a failpoint that holds
// every request for sleep at point (for example "before-provider-call",
// after the local commit and the PROVIDER_REQUEST_SENT checkpoint), lets
// requests pile up there, then kills the node (SIGKILL): its owners die
// between their local commit and the provider's answer. Heal restarts the
// node without the failpoint.
func CrashMidRequest(env *Env, region string, i int, point string, sleep time.Duration) Fault {
	return &crashMidRequest{env: env, region: region, i: i, point: point, sleep: sleep}
}

func (f *crashMidRequest) Name() string {
	return fmt.Sprintf("crash-mid-request(%s-%d,%s)", f.region, f.i, f.point)
}
func (f *crashMidRequest) Available(c *cluster.Cluster) bool {
	return f.env != nil && f.env.nodes != nil && c.Node(f.region, f.i) != nil
}
func (f *crashMidRequest) Inject(ctx context.Context, c *cluster.Cluster) error {
	f.p = c.Node(f.region, f.i)
	args, env := f.env.nodes.overrides(f.p.Name())
	args, env = withEnv("IDEM_FAILPOINTS", fmt.Sprintf("%s=sleep(%s)", f.point, f.sleep*4))(args, env)
	if err := f.env.nodes.restartWith(ctx, f.p, args, env); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.sleep):
	}
	return f.p.Kill()
}
func (f *crashMidRequest) Heal(ctx context.Context, _ *cluster.Cluster) error {
	if f.p == nil {
		return nil
	}
	args, env := f.env.nodes.overrides(f.p.Name())
	args, env = withoutEnv("IDEM_FAILPOINTS")(args, env)
	return f.env.nodes.restartWith(ctx, f.p, args, env)
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/failover"
	"github.com/idemcoord/idem/internal/pgha"
	"github.com/idemcoord/idem/routing"
)

// StoreFailoverRTOBound is the RTO bound of a drill whose lost region held
// the replicated global store's primary: the leader key's TTL (Patroni
// promotes a standby only once it expired; about 15s from the loss to the
// first acknowledged write, measured), plus 10s for the promotion, the
// nodes' pools finding the new primary and a client's next call.
const StoreFailoverRTOBound = pgha.DefaultTTL + 10*time.Second

// --- region-lost: the nodes die for good, the store answers ---

type regionLost struct {
	notes
	env      *Env
	from, to string
	nodes    []*cluster.Process
	moved    *routing.RegionMove
	cutAt    time.Time
}

// RegionLost kills every node of region from (SIGKILL) and never brings
// them back: a region lost for good whose store still answers. Once etcd
// holds no live node of from, its tenants move to region to
// (failover.Move, as "idemctl region failover"). Heal restarts nothing: it
// takes over what from left in its store (failover.Handover, as "idemctl
// region handover"): its records of the moved tenants are copied into to's
// store, where recovery finishes the open ones once their lock runs out,
// and its outbox is run to its end (events published, deliveries consumed
// under from's effect claims, receipts sent). The region's nodes are left
// out of every later health check.
func RegionLost(env *Env, from, to string) Fault {
	return &regionLost{env: env, from: from, to: to}
}

func (f *regionLost) Name() string { return "region-lost(" + f.from + "→" + f.to + ")" }

// CutAt is when the nodes were killed: the drill measures its RTO from
// then.
func (f *regionLost) CutAt() time.Time { return f.cutAt }

// DrillRegion implements DrillFault.
func (f *regionLost) DrillRegion() string { return f.from }

// FailoverMode implements DrillFault.
func (f *regionLost) FailoverMode() string { return FailoverManual }

func (f *regionLost) Available(c *cluster.Cluster) bool {
	return c.EtcdClient() != nil && hasRegion(c, f.from) && hasRegion(c, f.to) && c.StoreMode() == cluster.StoreRegionLocal
}

func (f *regionLost) Inject(ctx context.Context, c *cluster.Cluster) error {
	f.nodes = regionNodes(c, f.from)
	f.env.markLost(f.from)
	f.cutAt = time.Now()
	var errs []error
	for _, p := range f.nodes {
		errs = append(errs, p.Kill())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.note("killed the %d nodes of %s (SIGKILL); they are never restarted", len(f.nodes), f.from)
	mv, err := failover.Move(ctx, c.EtcdClient(), f.from, f.to, 3*f.env.LeaseTTL+15*time.Second, nil)
	if err != nil {
		return fmt.Errorf("chaos: region %s: %w", f.from, err)
	}
	f.moved = &mv
	f.env.setFailedOver()
	f.note("moved %s's tenants to %s (epoch %d) %v after the kill", f.from, mv.ServedBy, mv.Epoch, time.Since(f.cutAt).Round(100*time.Millisecond))
	return nil
}

func (f *regionLost) Heal(ctx context.Context, c *cluster.Cluster) error {
	if f.moved == nil {
		return nil
	}
	f.note("%s stays down: its store still answers, so %s takes over what it left there", f.from, f.to)
	return handover(ctx, c, f.from, f.to, &f.notes)
}

// --- region-lost-with-store: the nodes and the store's primary die ---

type regionLostWithStore struct {
	notes
	env    *Env
	region string
	member *pgha.Member
	nodes  []*cluster.Process
	cutAt  time.Time
}

// RegionLostWithStore loses, for good, the region that holds the
// replicated global store's primary: its member of the store (PostgreSQL
// and its Patroni agent) and every node of it are killed (SIGKILL) and
// never restarted. The store's synchronous standby, in another region,
// is promoted (strict synchronous replication: every acknowledged commit
// is on it), and since every region serves every tenant from the global
// store, no tenant needs to move: clients reach the other regions, whose
// nodes' multi-host URL finds the new primary. The fault's note gives the
// store's recovery time. Heal brings nothing back. The scenario needs
// Scenario.StoreHA.
func RegionLostWithStore(env *Env) Fault { return &regionLostWithStore{env: env} }

func (f *regionLostWithStore) Name() string {
	if f.region == "" {
		return "region-lost-with-store(the primary's region)"
	}
	return "region-lost-with-store(" + f.region + ")"
}

// CutAt is when the region was killed.
func (f *regionLostWithStore) CutAt() time.Time { return f.cutAt }

// DrillRegion implements DrillFault: the region that held the primary.
func (f *regionLostWithStore) DrillRegion() string { return f.region }

// FailoverMode implements DrillFault: in global store mode no tenant
// moves.
func (f *regionLostWithStore) FailoverMode() string { return FailoverNone }

// RTOBound is the drill's RTO bound: the store's failover, not a region
// lease, is what the region's tenants wait for.
func (f *regionLostWithStore) RTOBound(time.Duration) time.Duration { return StoreFailoverRTOBound }

func (f *regionLostWithStore) Available(c *cluster.Cluster) bool { return hasStoreHA(c) }

func (f *regionLostWithStore) Inject(ctx context.Context, c *cluster.Cluster) error {
	m, err := leaderMember(ctx, c)
	if err != nil {
		return err
	}
	f.member, f.region, f.nodes = m, m.Region, regionNodes(c, m.Region)
	f.env.markLost(m.Region)
	f.cutAt = time.Now()
	errs := []error{m.Kill(ctx)}
	for _, p := range f.nodes {
		errs = append(errs, p.Kill())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.note("killed %s, the store's primary, and the %d nodes of its region %s (SIGKILL); none is restarted", m.Name, len(f.nodes), m.Region)
	took, err := waitWritable(ctx, c, f.cutAt)
	if err != nil {
		return err
	}
	name := "?"
	if leader, err := c.Store().Leader(ctx); err == nil {
		name = leader.Name
	}
	f.note("store recovery: %.2fs from the kill to the first write through the multi-host URL (new primary %s)", took.Seconds(), name)
	return nil
}

func (f *regionLostWithStore) Heal(ctx context.Context, c *cluster.Cluster) error {
	if f.member == nil {
		return nil
	}
	// The two members left must still make a store that acknowledges
	// commits: a leader and a synchronous standby.
	if err := healStore(ctx, c); err != nil {
		return err
	}
	f.note("%s stays lost; the store runs on the other members, with a synchronous standby", f.region)
	return nil
}

package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/routing"
)

// autoFailover takes a region down (its nodes killed, or the region
// partitioned) in a cluster whose nodes run automatic failover
// (--auto-failover-after), and waits, doing nothing, until the nodes have
// moved the region's tenants elsewhere.
type autoFailover struct {
	notes
	env    *Env
	region string
	down   Fault // KillRegion or PartitionRegion
	moved  *routing.RegionMove
}

// RegionAutoFailover kills every node of region (partition false) or cuts
// the region off (partition true), then waits until the cluster's own
// automatic failover has moved its tenants to another region: nobody
// performs the failover. Heal restarts the nodes or restores the links and
// hands the region's records of the moved tenants over to their new home
// (failover.Handover, as "idemctl region handover" once the region is
// back). The nodes must run with --auto-failover-after.
func RegionAutoFailover(env *Env, region string, partition bool) Fault {
	down := KillRegion(region)
	if partition {
		down = PartitionRegion(region)
	}
	return &autoFailover{env: env, region: region, down: down}
}

func (f *autoFailover) Name() string { return "auto-failover(" + f.down.Name() + ")" }

func (f *autoFailover) Available(c *cluster.Cluster) bool {
	return f.down.Available(c) && c.EtcdClient() != nil && c.StoreMode() == cluster.StoreRegionLocal
}

// DrillRegion implements DrillFault.
func (f *autoFailover) DrillRegion() string { return f.region }

// FailoverMode implements DrillFault.
func (f *autoFailover) FailoverMode() string { return FailoverAuto }

func (f *autoFailover) Inject(ctx context.Context, c *cluster.Cluster) error {
	cli := c.EtcdClient()
	before, _, err := routing.GetRegionMove(ctx, cli, f.region)
	if err != nil {
		return fmt.Errorf("chaos: %s's move before the fault: %w", f.region, err)
	}
	began := time.Now()
	if err := f.down.Inject(ctx, c); err != nil {
		return err
	}
	deadline := began.Add(3*f.env.LeaseTTL + 15*time.Second)
	for {
		mv, found, err := routing.GetRegionMove(ctx, cli, f.region)
		if err == nil && found && mv.Epoch > before.Epoch && mv.ServedBy != f.region {
			f.moved = &mv
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the nodes did not fail %s over within %v (are they running --auto-failover-after?)", f.region, time.Since(began).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	f.note("the nodes moved %s's tenants to %s (epoch %d) %v after the fault, nobody acting",
		f.region, f.moved.ServedBy, f.moved.Epoch, time.Since(began).Round(100*time.Millisecond))
	f.env.setFailedOver()
	return nil
}

func (f *autoFailover) Heal(ctx context.Context, c *cluster.Cluster) error {
	if err := f.down.Heal(ctx, c); err != nil {
		return err
	}
	for _, p := range regionNodes(c, f.region) {
		if err := p.WaitReady(ctx); err != nil {
			return err
		}
	}
	if f.moved == nil {
		return nil
	}
	return handover(ctx, c, f.region, f.moved.ServedBy, &f.notes)
}

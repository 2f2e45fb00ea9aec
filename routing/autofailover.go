package routing

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ElectionPrefix is where nodes campaign to run automatic failover.
const ElectionPrefix = "/idem/election/failover"

// AutoFailover moves the tenants of a region that has had no live node for
// After to a surviving region. One node at a time runs it (an etcd election);
// the move itself is MoveRegion, one transaction whatever the number of
// tenants, which re-checks that the region is still without a live node. It
// is off unless configured.
type AutoFailover struct {
	Client *clientv3.Client
	Map    *Map
	// Region is this node's region, the default target.
	Region string
	// After is how long a region must have been without a live node.
	After time.Duration
	// Targets maps a failed region to the region that takes over its
	// tenants; a region not listed goes to the elected node's own region.
	Targets map[string]string
	// SessionTTL is the election session's TTL: how long the election
	// stays with a leader that died before another node takes it over.
	// Default 5s; a node sets it to its region lease TTL, so that a
	// region's death is noticed as fast as its leases lapse. Rounded up to
	// whole seconds (etcd lease TTLs are seconds).
	SessionTTL time.Duration
	// Interval is how often the leader looks at the regions. Default 1s.
	Interval time.Duration
	// Ticks, if set, replaces the Interval ticker: the leader looks at the
	// regions once per value received, taking it as the time of the look
	// (a test sends the times of its own clock).
	Ticks <-chan time.Time
	// Now is the node's clock, for the time a move records. Default
	// time.Now. How long a region has been dead is measured between ticks.
	Now    func() time.Time
	Logger *slog.Logger
	// OnMove is called after each region move. Optional.
	OnMove func(RegionMove)
}

// Run campaigns and, while elected, checks every Interval. It returns when ctx
// is done.
func (a *AutoFailover) Run(ctx context.Context) error {
	if a.Now == nil {
		a.Now = time.Now
	}
	if a.Logger == nil {
		a.Logger = slog.New(slog.DiscardHandler)
	}
	if a.SessionTTL <= 0 {
		a.SessionTTL = 5 * time.Second
	}
	if a.Interval <= 0 {
		a.Interval = time.Second
	}
	for ctx.Err() == nil {
		if err := a.lead(ctx); err != nil && ctx.Err() == nil {
			a.Logger.Warn("automatic failover: election lost or failed; campaigning again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (a *AutoFailover) lead(ctx context.Context) error {
	session, err := concurrency.NewSession(a.Client, concurrency.WithTTL(int((a.SessionTTL+time.Second-1)/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer func() { _ = session.Close() }()
	election := concurrency.NewElection(session, ElectionPrefix)
	if err := election.Campaign(ctx, a.Region); err != nil {
		return err
	}
	a.Logger.Info("automatic failover: elected", "region", a.Region, "after", a.After)
	deadSince := map[string]time.Time{}
	ticks := a.Ticks
	if ticks == nil {
		tick := time.NewTicker(a.Interval)
		defer tick.Stop()
		ticks = tick.C
	}
	for {
		var now time.Time // the tick's time: how long a region has been dead is measured in ticks' times
		select {
		case <-ctx.Done():
			return nil
		case <-session.Done():
			return context.Canceled
		case now = <-ticks:
		}
		for _, region := range a.Map.HomeRegions() {
			if len(a.Map.Nodes(region)) > 0 {
				delete(deadSince, region)
				continue
			}
			since, ok := deadSince[region]
			if !ok {
				deadSince[region] = now
				continue
			}
			if now.Sub(since) < a.After {
				continue
			}
			to := a.Targets[region]
			if to == "" {
				to = a.Region
			}
			if to == region {
				continue
			}
			moved, err := MoveRegion(ctx, a.Client, region, to, a.Now())
			if err != nil {
				a.Logger.Warn("automatic failover failed", "from", region, "to", to, "err", err)
				continue
			}
			a.Logger.Warn("automatic failover", "from", region, "to", to, "epoch", moved.Epoch, "dead_for", now.Sub(since))
			if a.OnMove != nil {
				a.OnMove(moved)
			}
			delete(deadSince, region)
		}
	}
}

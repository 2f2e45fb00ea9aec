// Package failover is the region failover procedure, in one place for every
// caller: the operator's "idemctl region failover" and "region handover",
// the chaos harness's region faults and "idemctl drill".
//
// A failover is two steps. [Move] waits until the failed region has no live
// node in etcd (its nodes stopped, or their leases lapsed: a partitioned
// region stops serving on its own at its local lease deadline) and then
// moves its tenants to another region with one conditional etcd write
// (routing.MoveRegion), which re-checks that the region is still without a
// live node. [Handover], once the failed region's store is reachable again,
// merges its records of the moved tenants into the new home's store
// (store.Handover, idempotent, conflicts reported), ends their
// uncertainty window, and takes over what the region's outbox left
// undone (outbox.Drain): a region lost for good has no node left to
// publish its events, consume its deliveries or send its receipts, and
// only its own store holds them. Open records need nothing more: the new
// home's recovery takes the copied ones over once their lock runs out. Automatic failover (idemd --auto-failover-after,
// routing.AutoFailover) performs the same move from inside the cluster.
package failover

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// PollInterval is how often Move re-checks a region that is still alive.
const PollInterval = 200 * time.Millisecond

// AttemptTimeout bounds each of Move's attempts.
const AttemptTimeout = time.Second

// Move moves the tenants of region from to region to once from has no live
// node left in etcd, waiting up to wait for its leases to lapse; waiting,
// if set, is called once per check that found from still alive. It returns
// the move (its Epoch is the tenants' new epoch). A move that loses a race
// on the region's key (another move, or a lease lapsing between the read
// and the transaction) is tried again, as is one that etcd could not
// answer for a while (no leader, a leader lost with the failed region: see
// Transient); a move whose answer was lost and that had committed is
// written again, to the same effect. After wait it fails with an error
// wrapping routing.ErrRegionAlive, routing.ErrEpochChanged or the last
// transient error.
func Move(ctx context.Context, cli *clientv3.Client, from, to string, wait time.Duration, waiting func()) (routing.RegionMove, error) {
	deadline := time.Now().Add(wait)
	for {
		// A member cut off with the failed region may still take requests
		// it cannot answer: each attempt requires a leader (such a member
		// refuses at once) and is bounded, and the next one goes to
		// another member.
		actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), AttemptTimeout)
		mv, err := routing.MoveRegion(actx, cli, from, to, time.Now())
		cancel()
		if err == nil {
			return mv, nil
		}
		// ErrEpochChanged: the region's key or its liveness changed between
		// MoveRegion's read and its transaction (a lease lapsing in
		// between, as a dead region's does); read and check again.
		if !errors.Is(err, routing.ErrRegionAlive) && !errors.Is(err, routing.ErrEpochChanged) && !Transient(ctx, err) {
			return routing.RegionMove{}, err
		}
		if time.Now().After(deadline) {
			return routing.RegionMove{}, fmt.Errorf("failover: %w after %v: a failover waits until the region has stopped serving (a partitioned region stops on its own once its lease runs out)", err, wait)
		}
		if waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			return routing.RegionMove{}, ctx.Err()
		case <-time.After(PollInterval):
		}
	}
}

// Transient reports whether err is etcd failing to answer for a while
// rather than refusing: a request that timed out in the cluster (its
// leader lost, as when the failed region held it), no leader yet, a leader
// change, or a member out of reach, while ctx itself is still live. Such a
// request may or may not have been applied.
func Transient(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	for _, e := range []error{
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrTimeoutWaitAppliedIndex,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// TenantReport is the handover of one tenant.
type TenantReport struct {
	Tenant string `json:"tenant"`
	store.HandoverReport
}

// Report is what Handover did.
type Report struct {
	Tenants []TenantReport `json:"tenants"`
	// Conflicts counts records both stores hold with different meanings
	// (the new home's were kept).
	Conflicts int `json:"conflicts"`
	// Outbox is what was left undone in the old region's outbox, and what
	// the handover did of it (outbox.Drain).
	Outbox outbox.DrainReport `json:"outbox"`
	// OutboxLeftToRegion says the old region had a live node again (its
	// nodes came back, as after a partition that healed): its own nodes
	// work its outbox, so the handover left it to them. A second worker
	// beside them could send a receipt twice.
	OutboxLeftToRegion bool `json:"outboxLeftToRegion,omitempty"`
}

// Stores names the databases of a handover.
type Stores struct {
	// From is the store of the region the tenants left; To their new
	// home's (both required).
	From, To string
	// Effects is the database where every region claims its consumer
	// effects (idemd --effects-database-url); "" when the cluster has none
	// (one store for every region, or no such database).
	Effects string
}

// HandoverURLs is Handover between the stores dbs names, each opened for
// the handover and closed after; the old region's effects are claimed in
// dbs.Effects under its name, as its nodes claimed them.
func HandoverURLs(ctx context.Context, cli *clientv3.Client, from, to string, dbs Stores) (Report, error) {
	src, err := store.Open(ctx, dbs.From, store.Options{})
	if err != nil {
		return Report{}, fmt.Errorf("failover: handover: store of %s: %w", from, err)
	}
	defer src.Close()
	dst, err := store.Open(ctx, dbs.To, store.Options{})
	if err != nil {
		return Report{}, fmt.Errorf("failover: handover: store of %s: %w", to, err)
	}
	defer dst.Close()
	var guard *outbox.EffectGuard
	if dbs.Effects != "" {
		pool, err := pgxpool.New(ctx, dbs.Effects)
		if err != nil {
			return Report{}, fmt.Errorf("failover: handover: effects database: %w", err)
		}
		defer pool.Close()
		if guard, err = outbox.NewEffectGuard(ctx, pool, from); err != nil {
			return Report{}, fmt.Errorf("failover: handover: %w", err)
		}
	}
	return Handover(ctx, cli, from, to, src, dst, guard)
}

// Handover merges src's records (the store of region from) of the tenants
// now served by region to, because of a failover from from, into dst (to's
// store), and marks them handed over in etcd: to stops treating their keys
// it has no record of as uncertain. Tenants are those with a placement of
// their own and those src holds records of (tenants homed by the default
// rule are named nowhere else). Then it takes over what src's outbox left
// undone (outbox.Drain: events published, deliveries consumed with their
// effects claimed through effects, which is region from's guard or nil,
// receipts sent), which from's nodes would have done had they lived, unless
// from has a live node again (Report.OutboxLeftToRegion); a
// receipt under a dead sender's claim is left for after its lease
// (Report.Outbox.Left.Leased: run Handover again then). It is idempotent.
func Handover(ctx context.Context, cli *clientv3.Client, from, to string, src, dst *store.Store, effects *outbox.EffectGuard) (Report, error) {
	rep := Report{Tenants: []TenantReport{}}
	m, err := routing.NewMap(ctx, cli, nil)
	if err != nil {
		return rep, err
	}
	defer m.Close()
	tenants := map[string]bool{}
	for _, p := range m.Placements() {
		tenants[p.Tenant] = true
	}
	held, err := storeTenants(ctx, src)
	if err != nil {
		return rep, err
	}
	for _, t := range held {
		tenants[t] = true
	}
	names := make([]string, 0, len(tenants))
	for t := range tenants {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, tenant := range names {
		p, ok := m.Placement(tenant)
		if !ok || p.Region != to {
			continue
		}
		f, ok := m.Failover(tenant)
		if !ok || f.To != to || (f.From != from && f.Region != from) {
			continue
		}
		tr, err := store.Handover(ctx, src, dst, tenant, payments.HandoverRows)
		if err != nil {
			return rep, err
		}
		if f.Region == "" {
			if err := routing.MarkHandedOver(ctx, cli, tenant); err != nil {
				return rep, err
			}
		}
		rep.Conflicts += len(tr.Conflicts)
		rep.Tenants = append(rep.Tenants, TenantReport{Tenant: tenant, HandoverReport: tr})
	}
	// One mark per region move: it ends the uncertainty of every tenant the
	// move took to to, whatever their number.
	for _, mv := range m.RegionMoves() {
		if mv.ServedBy == to && (mv.From == from || mv.Region == from) && !mv.HandedOver {
			if err := routing.MarkRegionHandedOver(ctx, cli, mv); err != nil {
				return rep, err
			}
		}
	}
	alive, err := routing.RegionAlive(ctx, cli, from)
	if err != nil {
		return rep, fmt.Errorf("failover: handover: %w", err)
	}
	if alive {
		rep.OutboxLeftToRegion = true
		return rep, nil
	}
	rep.Outbox, err = outbox.Drain(ctx, src, outbox.DrainConfig{Guard: effects})
	if err != nil {
		return rep, fmt.Errorf("failover: handover: %s's outbox: %w", from, err)
	}
	return rep, nil
}

// storeTenants lists the tenants a store holds records or payments of.
func storeTenants(ctx context.Context, s *store.Store) ([]string, error) {
	var tenants []string
	err := s.Read(ctx, func(q store.Querier) error {
		rows, err := q.Query(ctx, `SELECT tenant_id FROM idempotency_records UNION SELECT tenant_id FROM payments`)
		if err != nil {
			return err
		}
		tenants, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("failover: list tenants: %w", err)
	}
	return tenants, nil
}

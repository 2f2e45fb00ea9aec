package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/pgha"
)

// Timings of the replicated store's faults.
const (
	// storeRecoveryTimeout bounds the wait for the first write after a
	// store fault: the leader key's TTL, an election and a promotion.
	storeRecoveryTimeout = 90 * time.Second
	// storeProbeInterval is the pause between write attempts.
	storeProbeInterval = 50 * time.Millisecond
	// storeAttemptTimeout bounds one write attempt (a commit waiting for a
	// synchronous standby that is gone would wait for ever).
	storeAttemptTimeout = 2 * time.Second
)

// storeProbeTable is where the store faults write their own rows, in the
// global database, beside the service's tables.
const storeProbeTable = "chaos_store_probe"

func hasStoreHA(c *cluster.Cluster) bool { return c.Store() != nil }

// probeWrite inserts one row through url on a connection of its own and
// reports whether the commit was acknowledged.
func probeWrite(ctx context.Context, url, source string, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, storeAttemptTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("chaos: store probe: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+storeProbeTable+" (source text NOT NULL, id bigint NOT NULL, PRIMARY KEY (source, id))"); err != nil {
		return fmt.Errorf("chaos: store probe: %w", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+storeProbeTable+" (source, id) VALUES ($1, $2) ON CONFLICT DO NOTHING", source, id); err != nil {
		return fmt.Errorf("chaos: store probe: %w", err)
	}
	return nil
}

// waitWritable writes through the multi-host URL until a write is
// acknowledged, and returns how long after since that was.
func waitWritable(ctx context.Context, c *cluster.Cluster, since time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, storeRecoveryTimeout)
	defer cancel()
	var last error
	for i := int64(0); ; i++ {
		if last = probeWrite(ctx, c.StoreURL(), "recovery", time.Now().UnixNano()); last == nil {
			return time.Since(since), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("chaos: no write through the store's multi-host URL within %v: %w", storeRecoveryTimeout, last)
		case <-time.After(storeProbeInterval):
		}
	}
}

// leaderMember returns the replicated store's leader.
func leaderMember(ctx context.Context, c *cluster.Cluster) (*pgha.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		m, err := c.Store().Leader(ctx)
		if err == nil {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("chaos: the replicated store's leader: %w", err)
		case <-time.After(storeProbeInterval):
		}
	}
}

// waitNewLeader waits until a member other than old holds the leader key.
func waitNewLeader(ctx context.Context, c *cluster.Cluster, old *pgha.Member) (*pgha.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, storeRecoveryTimeout)
	defer cancel()
	for {
		if m, err := c.Store().Leader(ctx); err == nil && m != old {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("chaos: no new leader of the replicated store: %w", ctx.Err())
		case <-time.After(storeProbeInterval):
		}
	}
}

// healStore waits until the store has a leader, a synchronous standby and
// every member running.
func healStore(ctx context.Context, c *cluster.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, storeRecoveryTimeout)
	defer cancel()
	return c.Store().WaitHealthy(ctx)
}

// --- store-primary-loss ---

type storePrimaryLoss struct {
	notes
	member *pgha.Member
	nodes  []*cluster.Process
}

// StorePrimaryLoss kills the replicated store's primary member (its
// PostgreSQL server and its Patroni agent) and every node of its region,
// as the loss of that region would, and measures the store's recovery:
// the time from the kill to the first write acknowledged through the
// multi-host URL the nodes use. Heal restarts the member, which rejoins
// as a replica, and the nodes.
func StorePrimaryLoss() Fault { return &storePrimaryLoss{} }

func (f *storePrimaryLoss) Name() string                      { return "store-primary-loss" }
func (f *storePrimaryLoss) Available(c *cluster.Cluster) bool { return hasStoreHA(c) }

func (f *storePrimaryLoss) Inject(ctx context.Context, c *cluster.Cluster) error {
	m, err := leaderMember(ctx, c)
	if err != nil {
		return err
	}
	f.member, f.nodes = m, regionNodes(c, m.Region)
	at := time.Now()
	errs := []error{m.Kill(ctx)}
	for _, p := range f.nodes {
		errs = append(errs, p.Kill())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.note("killed the store's primary %s and the %d nodes of region %s", m.Name, len(f.nodes), m.Region)
	took, err := waitWritable(ctx, c, at)
	if err != nil {
		return err
	}
	leader, lerr := c.Store().Leader(ctx)
	name := "?"
	if lerr == nil {
		name = leader.Name
	}
	f.note("store recovery: %.2fs from the kill to the first write through the multi-host URL (new primary %s)", took.Seconds(), name)
	return nil
}

func (f *storePrimaryLoss) Heal(ctx context.Context, c *cluster.Cluster) error {
	if f.member == nil {
		return nil
	}
	err := f.member.Start()
	if err == nil {
		err = healStore(ctx, c)
	}
	return errors.Join(err, restartAll(ctx, f.nodes))
}

// --- store-partition ---

type storePartition struct {
	notes
	member *pgha.Member
	links  []string
	at     time.Time

	// The isolated old primary is written to directly while it is cut
	// off: every write it acknowledges must be on the new primary.
	stop   context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	acked  []int64
	failed int
}

// StorePartition cuts the replicated store's primary member from its
// replicas and from etcd (its Patroni agent's etcd links, the replicas'
// connections to its server and the other agents' to its REST API); the
// nodes still reach it. The old primary must stop acknowledging commits
// (strict synchronous replication, then demotion once it cannot renew the
// leader key) and a replica is promoted. While the partition holds, the
// fault writes to the isolated member directly; at Heal every write it
// acknowledged must be on the new primary (no split brain).
func StorePartition() Fault { return &storePartition{} }

func (f *storePartition) Name() string { return "store-partition" }
func (f *storePartition) Available(c *cluster.Cluster) bool {
	return hasStoreHA(c) && proxied(c)
}

func (f *storePartition) Inject(ctx context.Context, c *cluster.Cluster) error {
	m, err := leaderMember(ctx, c)
	if err != nil {
		return err
	}
	f.member = m
	f.links = c.LinksTouching(m.Name, m.Name+"-api")
	f.at = time.Now()
	if err := c.Partition(f.links...); err != nil {
		return err
	}
	f.note("cut the store's primary %s off (%d links); the nodes still reach it", m.Name, len(f.links))

	direct := directURL(c, m)
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	f.stop, f.done = stop, make(chan struct{})
	go func() {
		defer close(f.done)
		for id := int64(1); wctx.Err() == nil; id++ {
			err := probeWrite(wctx, direct, "isolated", id)
			f.mu.Lock()
			if err == nil {
				f.acked = append(f.acked, id)
			} else {
				f.failed++
			}
			f.mu.Unlock()
			select {
			case <-wctx.Done():
			case <-time.After(storeProbeInterval):
			}
		}
	}()

	leader, err := waitNewLeader(ctx, c, m)
	if err != nil {
		return err
	}
	took, err := waitWritable(ctx, c, f.at)
	if err != nil {
		return err
	}
	f.note("store recovery: %.2fs from the cut to the first write through the multi-host URL (new primary %s)", took.Seconds(), leader.Name)
	return nil
}

// directURL is the multi-host URL narrowed to member m, without
// target_session_attrs: a client that still reaches the old primary.
func directURL(c *cluster.Cluster, m *pgha.Member) string {
	return m.URLWithPassword(cluster.GlobalDatabase)
}

func (f *storePartition) Heal(ctx context.Context, c *cluster.Cluster) error {
	if f.member == nil {
		return nil
	}
	if f.stop != nil {
		f.stop()
		<-f.done
	}
	err := c.Heal(f.links...)
	if err == nil {
		err = healStore(ctx, c)
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	acked, failed := append([]int64(nil), f.acked...), f.failed
	f.mu.Unlock()
	missing, err := missingProbes(ctx, c, "isolated", acked)
	if err != nil {
		return err
	}
	f.note("writes to the isolated old primary while cut off: %d acknowledged, %d refused or unanswered; acknowledged but missing on the new primary: %d", len(acked), failed, len(missing))
	if len(missing) > 0 {
		return fmt.Errorf("chaos: split brain: %d writes the isolated old primary acknowledged are not on the new primary (first %d)", len(missing), missing[0])
	}
	return nil
}

// missingProbes returns which of ids (of source) the store lacks.
func missingProbes(ctx context.Context, c *cluster.Cluster, source string, ids []int64) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, storeRecoveryTimeout)
	defer cancel()
	var last error
	for {
		conn, err := pgx.Connect(ctx, c.StoreURL())
		if err == nil {
			var missing []int64
			err = conn.QueryRow(ctx, "SELECT coalesce(array_agg(w.id), '{}') FROM unnest($1::bigint[]) AS w(id) WHERE NOT EXISTS (SELECT 1 FROM "+storeProbeTable+" p WHERE p.source = $2 AND p.id = w.id)", ids, source).Scan(&missing)
			_ = conn.Close(context.WithoutCancel(ctx))
			if err == nil {
				return missing, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("chaos: read the store's probe rows: %w", last)
		case <-time.After(storeProbeInterval):
		}
	}
}

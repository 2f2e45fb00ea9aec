package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fencing"
)

// Membership is a node's place in its region: a liveness lease in etcd (with
// a local deadline, see package fencing), the node key registered under it,
// and a Locker for recovery fencing locks held by the same lease. When the
// lease is lost (etcd unreachable past the deadline, or expired), Membership
// grants a new one and registers again; until then Valid reports false and
// the node does not serve its region's tenants.
type Membership struct {
	cli    *clientv3.Client
	region string
	nodeID string
	url    string
	ttl    time.Duration
	logger *slog.Logger

	lease       atomic.Pointer[fencing.Lease]
	locker      atomic.Pointer[fencing.Locker]
	servingFrom atomic.Int64

	cancel context.CancelFunc
	done   chan struct{}
}

// Join grants a lease of ttl, registers the node (region, nodeID, url) under
// it and keeps both alive until Close.
func Join(ctx context.Context, cli *clientv3.Client, region, nodeID, url string, ttl time.Duration, logger *slog.Logger) (*Membership, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Membership{cli: cli, region: region, nodeID: nodeID, url: url, ttl: ttl, logger: logger, done: make(chan struct{})}
	if err := m.join(ctx); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	go m.maintain(mctx)
	return m, nil
}

func (m *Membership) join(ctx context.Context) error {
	lease, err := fencing.Grant(ctx, m.cli, m.ttl)
	if err != nil {
		return fmt.Errorf("routing: join %s: %w", m.region, err)
	}
	val, _ := json.Marshal(nodeValue{URL: m.url})
	resp, err := m.cli.Put(ctx, NodeKey(m.region, m.nodeID), string(val), clientv3.WithLease(lease.ID()))
	if err != nil {
		_ = lease.Close(ctx)
		return fmt.Errorf("routing: register node: %w", err)
	}
	locker, err := fencing.NewLocker(m.cli, lease, LocksPrefix)
	if err != nil {
		_ = lease.Close(ctx)
		return fmt.Errorf("routing: recovery locker: %w", err)
	}
	m.servingFrom.Store(resp.Header.Revision)
	m.lease.Store(lease)
	if old := m.locker.Swap(locker); old != nil {
		_ = old.Close()
	}
	m.logger.Info("joined region", "region", m.region, "node", m.nodeID, "lease", int64(lease.ID()), "ttl", lease.TTL())
	return nil
}

// maintain re-joins whenever the lease dies.
func (m *Membership) maintain(ctx context.Context) {
	defer close(m.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.lease.Load().Done():
		}
		m.logger.Warn("region lease lost; not serving home tenants until re-joined", "region", m.region, "node", m.nodeID)
		for backoff := 100 * time.Millisecond; ; backoff = min(backoff*2, 2*time.Second) {
			jctx, cancel := context.WithTimeout(ctx, m.ttl)
			err := m.join(jctx)
			cancel()
			if err == nil {
				break
			}
			m.logger.Warn("re-joining region failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
	}
}

// Valid reports whether the node's current lease is within its local
// deadline.
func (m *Membership) Valid() bool { return m.lease.Load().Valid() }

// ServingFrom is the etcd revision of the node's latest registration.
func (m *Membership) ServingFrom() int64 { return m.servingFrom.Load() }

// TryLock takes a recovery fencing lock under the current lease (see
// fencing.Locker.TryLock); Membership satisfies engine.Locker.
func (m *Membership) TryLock(ctx context.Context, key string) (idem.Lock, error) {
	return m.locker.Load().TryLock(ctx, key)
}

// Close stops maintenance and releases the lease (the node key goes with
// it), so the region stops counting this node at once.
func (m *Membership) Close(ctx context.Context) error {
	m.cancel()
	<-m.done
	if l := m.locker.Load(); l != nil {
		_ = l.Close()
	}
	return m.lease.Load().Close(ctx)
}

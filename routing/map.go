package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Map is a node's local copy of placements, live nodes and failovers,
// loaded at one etcd revision and kept current by a watch. It is safe for
// concurrent use. Close stops the watch.
type Map struct {
	cli    *clientv3.Client
	logger *slog.Logger

	mu         sync.RWMutex
	changed    chan struct{} // closed and replaced on every applied revision
	placements map[string]Placement
	nodes      map[string]map[string]string // region -> node id -> url
	failovers  map[string]Failover
	rev        int64

	cancel context.CancelFunc
	done   chan struct{}
}

// NewMap loads the routing state from etcd and starts watching it. The
// returned Map is current as of the load; cancel ctx or call Close to stop.
func NewMap(ctx context.Context, cli *clientv3.Client, logger *slog.Logger) (*Map, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Map{cli: cli, logger: logger, changed: make(chan struct{}), done: make(chan struct{})}
	if err := m.load(ctx); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	go m.watch(wctx)
	return m, nil
}

// Close stops the watch and waits for it to end.
func (m *Map) Close() {
	m.cancel()
	<-m.done
}

func (m *Map) load(ctx context.Context) error {
	resp, err := m.cli.Get(ctx, "/idem/", clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("routing: load map: %w", err)
	}
	placements, nodes, failovers := map[string]Placement{}, map[string]map[string]string{}, map[string]Failover{}
	for _, kv := range resp.Kvs {
		applyPut(placements, nodes, failovers, kv, m.logger)
	}
	m.mu.Lock()
	m.placements, m.nodes, m.failovers, m.rev = placements, nodes, failovers, resp.Header.Revision
	m.broadcastLocked()
	m.mu.Unlock()
	return nil
}

func (m *Map) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Map) watch(ctx context.Context) {
	defer close(m.done)
	for ctx.Err() == nil {
		m.mu.RLock()
		from := m.rev + 1
		m.mu.RUnlock()
		wch := m.cli.Watch(clientv3.WithRequireLeader(ctx), "/idem/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					m.logger.Warn("routing watch compacted; reloading", "err", err)
					if err := m.load(ctx); err != nil {
						m.logger.Warn("routing reload failed", "err", err)
					}
				}
				break
			}
			m.apply(resp)
		}
	}
}

func (m *Map) apply(resp clientv3.WatchResponse) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			key := string(ev.Kv.Key)
			switch {
			case strings.HasPrefix(key, PlacementPrefix):
				delete(m.placements, key[len(PlacementPrefix):])
			case strings.HasPrefix(key, FailoverPrefix):
				delete(m.failovers, key[len(FailoverPrefix):])
			default:
				if region, id, ok := parseNodeKey(key); ok {
					delete(m.nodes[region], id)
				}
			}
			continue
		}
		applyPut(m.placements, m.nodes, m.failovers, ev.Kv, m.logger)
	}
	if resp.Header.Revision > m.rev {
		m.rev = resp.Header.Revision
	}
	m.broadcastLocked()
}

func applyPut(placements map[string]Placement, nodes map[string]map[string]string, failovers map[string]Failover, kv *mvccpb.KeyValue, logger *slog.Logger) {
	key := string(kv.Key)
	switch {
	case strings.HasPrefix(key, PlacementPrefix):
		tenant := key[len(PlacementPrefix):]
		p, err := decodePlacement(tenant, kv.Value, kv.ModRevision)
		if err != nil {
			logger.Warn("ignoring bad placement", "key", key, "err", err)
			return
		}
		placements[tenant] = p
	case strings.HasPrefix(key, FailoverPrefix):
		var f Failover
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			logger.Warn("ignoring bad failover record", "key", key, "err", err)
			return
		}
		if f.Epoch == 0 {
			// Written with the placement in one transaction: same revision.
			f.Epoch = kv.ModRevision
		}
		failovers[key[len(FailoverPrefix):]] = f
	default:
		region, id, ok := parseNodeKey(key)
		if !ok {
			return
		}
		var n nodeValue
		if err := json.Unmarshal(kv.Value, &n); err != nil || n.URL == "" {
			logger.Warn("ignoring bad node key", "key", key, "err", err)
			return
		}
		if nodes[region] == nil {
			nodes[region] = map[string]string{}
		}
		nodes[region][id] = n.URL
	}
}

// Placement returns the tenant's placement as the map knows it.
func (m *Map) Placement(tenant string) (Placement, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, ok := m.placements[tenant]
	return p, ok
}

// Placements returns every known placement, sorted by tenant.
func (m *Map) Placements() []Placement {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Placement, 0, len(m.placements))
	for _, p := range m.placements {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}

// Nodes returns the URLs of region's live nodes, sorted.
func (m *Map) Nodes(region string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.nodes[region]))
	for _, u := range m.nodes[region] {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Node is a live node of a region as registered in etcd.
type Node struct {
	// ID is the node's id in its region.
	ID string
	// URL is the base URL the node advertised.
	URL string
}

// NodeList returns region's live nodes, sorted by id.
func (m *Map) NodeList(region string) []Node {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Node, 0, len(m.nodes[region]))
	for id, u := range m.nodes[region] {
		out = append(out, Node{ID: id, URL: u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Failover returns the tenant's last failover record, if any.
func (m *Map) Failover(tenant string) (Failover, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	f, ok := m.failovers[tenant]
	return f, ok
}

// Revision returns the etcd revision the map reflects.
func (m *Map) Revision() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.rev
}

// WaitRevision blocks until the map reflects at least rev, or ctx is done.
func (m *Map) WaitRevision(ctx context.Context, rev int64) error {
	for {
		m.mu.RLock()
		cur, ch := m.rev, m.changed
		m.mu.RUnlock()
		if cur >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("routing: wait for revision %d (at %d): %w", rev, cur, ctx.Err())
		case <-ch:
		}
	}
}

type nodeValue struct {
	URL string `json:"url"`
}

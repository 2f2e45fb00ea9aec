package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// LoadPageSize is how many keys a Map reads per range request while it
// loads: the load is paginated at one revision, so neither etcd nor the node
// ever holds the whole keyspace in one response.
const LoadPageSize = 2000

// Map is a node's local copy of placements, region moves, live nodes and
// failovers, loaded at one etcd revision and kept current by a watch. It is
// safe for concurrent use. Close stops the watch.
type Map struct {
	cli    *clientv3.Client
	logger *slog.Logger

	mu      sync.RWMutex
	changed chan struct{} // closed and replaced on every applied revision
	s       *mapState
	rev     int64

	cancel context.CancelFunc
	done   chan struct{}

	// steer holds the endpoints the Map took out of cli while they were
	// silent (steer.go).
	steer steering
}

// mapState is the routing keyspace as a Map holds it.
type mapState struct {
	placementState
	placements map[string]Placement         // the tenants' own placements
	placedMax  map[string]int64             // region -> highest own placement epoch seen
	nodes      map[string]map[string]string // region -> node id -> url
	failovers  map[string]Failover          // the tenants' own failover records
	handovers  map[string]int64             // region -> epoch of the move handed over
}

func newMapState() *mapState {
	return &mapState{
		placementState: placementState{moves: map[string]RegionMove{}},
		placements:     map[string]Placement{}, placedMax: map[string]int64{},
		nodes: map[string]map[string]string{}, failovers: map[string]Failover{}, handovers: map[string]int64{},
	}
}

// NewMap loads the routing state from etcd and starts watching it. The
// returned Map is current as of the load; cancel ctx or call Close to stop.
// While its watch runs, the Map steers cli away from endpoints that a
// partition has silenced (cli.SetEndpoints, see RejoinInterval) and gives
// them back once they answer, or at Close.
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
	m.giveBackAll()
}

// load reads the keyspace in pages of LoadPageSize, all at the revision of
// the first page.
func (m *Map) load(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		s, rev, err := m.loadAt(ctx)
		if errors.Is(err, rpctypes.ErrCompacted) && attempt < 3 {
			continue // compacted between two pages: start again
		}
		if err != nil {
			return fmt.Errorf("routing: load map: %w", err)
		}
		m.mu.Lock()
		m.s, m.rev = s, rev
		m.broadcastLocked()
		m.mu.Unlock()
		return nil
	}
}

func (m *Map) loadAt(ctx context.Context) (*mapState, int64, error) {
	const prefix = "/idem/"
	end := clientv3.GetPrefixRangeEnd(prefix)
	s := newMapState()
	key, rev := prefix, int64(0)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(LoadPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := m.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			s.put(kv, m.logger)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return s, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func (m *Map) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Watch probing: every WatchProbeInterval a Map asks etcd for a progress
// notification on its watch, and a watch that has delivered nothing for
// WatchStaleAfter is closed and opened again (on another member, when the
// client has one: the client is first steered away from the members that
// do not answer, steer.go). A member that a partition cut off answers nothing and
// closes nothing, and gRPC's own keepalive cannot find such a connection
// dead in less than about 15s (it pings at most every 10s); meanwhile the
// node would route by a stale map (forwarding to a region that has failed
// over, say).
const (
	WatchProbeInterval = time.Second
	WatchStaleAfter    = 3 * time.Second
)

func (m *Map) watch(ctx context.Context) {
	defer close(m.done)
	attempt := 0
	for ctx.Err() == nil {
		m.mu.RLock()
		from := m.rev + 1
		m.mu.RUnlock()
		// The probe's progress requests go to this watch's stream: they
		// carry the same metadata (the require-leader flag).
		// Each watch gets a gRPC stream of its own (the client shares one
		// per metadata): the stream of a silent watch may never finish
		// closing. The probe starts first: opening the watch itself waits
		// for a member, which may be the silent one.
		attempt++
		wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "idem-watch", strconv.Itoa(attempt)))
		var heard atomic.Int64
		heard.Store(time.Now().UnixNano())
		probed := make(chan struct{})
		go func() {
			defer close(probed)
			m.probe(wctx, cancel, &heard)
		}()
		wch := m.cli.Watch(wctx, "/idem/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
		for resp := range wch {
			heard.Store(time.Now().UnixNano())
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
		cancel()
		<-probed
	}
}

// probe asks for progress on the watch of ctx every WatchProbeInterval, and
// cancels it once it has been silent (heard: when it last delivered, in
// Unix nanoseconds) for WatchStaleAfter.
func (m *Map) probe(ctx context.Context, cancel context.CancelFunc, heard *atomic.Int64) {
	t := time.NewTicker(WatchProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if silent := time.Since(time.Unix(0, heard.Load())); silent > WatchStaleAfter {
			m.logger.Warn("routing watch silent; opening it again", "silent", silent.Round(time.Millisecond))
			m.steerAway(ctx)
			cancel()
			return
		}
		rctx, rcancel := context.WithTimeout(ctx, WatchProbeInterval)
		_ = m.cli.RequestProgress(rctx)
		rcancel()
		m.rejoin(ctx)
	}
}

func (m *Map) apply(resp clientv3.WatchResponse) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			m.s.delete(string(ev.Kv.Key))
			continue
		}
		m.s.put(ev.Kv, m.logger)
	}
	if resp.Header.Revision > m.rev {
		m.rev = resp.Header.Revision
	}
	m.broadcastLocked()
}

func (s *mapState) delete(key string) {
	switch {
	case strings.HasPrefix(key, PlacementPrefix):
		delete(s.placements, key[len(PlacementPrefix):])
	case strings.HasPrefix(key, RegionPlacementPrefix):
		delete(s.moves, key[len(RegionPlacementPrefix):])
	case key == DefaultRegionsKey:
		s.defaults, s.defaultsEpoch = nil, 0
	case strings.HasPrefix(key, FailoverPrefix):
		delete(s.failovers, key[len(FailoverPrefix):])
	case strings.HasPrefix(key, HandoverPrefix):
		delete(s.handovers, key[len(HandoverPrefix):])
	default:
		if region, id, ok := parseNodeKey(key); ok {
			delete(s.nodes[region], id)
		}
	}
}

func (s *mapState) put(kv *mvccpb.KeyValue, logger *slog.Logger) {
	key := string(kv.Key)
	switch {
	case strings.HasPrefix(key, PlacementPrefix):
		tenant := key[len(PlacementPrefix):]
		p, err := decodePlacement(tenant, kv.Value, kv.ModRevision)
		if err != nil {
			logger.Warn("ignoring bad placement", "key", key, "err", err)
			return
		}
		s.placements[tenant] = p
		s.placedMax[p.Region] = max(s.placedMax[p.Region], p.Epoch)
	case strings.HasPrefix(key, RegionPlacementPrefix):
		mv, err := decodeRegionMove(kv)
		if err != nil {
			logger.Warn("ignoring bad region move", "key", key, "err", err)
			return
		}
		s.moves[mv.Region] = mv
	case key == DefaultRegionsKey:
		regions, err := decodeDefaultRegions(kv.Value)
		if err != nil {
			logger.Warn("ignoring bad default regions", "key", key, "err", err)
			return
		}
		s.defaults, s.defaultsEpoch = regions, kv.ModRevision
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
		s.failovers[key[len(FailoverPrefix):]] = f
	case strings.HasPrefix(key, HandoverPrefix):
		var h handoverValue
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			logger.Warn("ignoring bad handover mark", "key", key, "err", err)
			return
		}
		s.handovers[key[len(HandoverPrefix):]] = h.Epoch
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
		if s.nodes[region] == nil {
			s.nodes[region] = map[string]string{}
		}
		s.nodes[region][id] = n.URL
	}
}

// move returns a region move with its handover mark applied.
func (s *mapState) move(mv RegionMove) RegionMove {
	mv.HandedOver = s.handovers[mv.Region] == mv.Epoch
	return mv
}

// effective resolves tenant's placement and the failover record that
// applies to it.
func (s *mapState) effective(tenant string) (Placement, *RegionMove, bool) {
	var own *Placement
	if p, ok := s.placements[tenant]; ok {
		own = &p
	}
	p, ok := s.placed(tenant, own)
	if !ok {
		return Placement{}, nil, false
	}
	p, last := s.resolve(p, nil)
	return p, last, true
}

// Placement returns the tenant's effective placement as the map knows it:
// its own placement or, without one, its default home, followed through
// the region moves written after it. ok is false only when the tenant has
// no placement and no default region list is set.
func (m *Map) Placement(tenant string) (Placement, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, _, ok := m.s.effective(tenant)
	return p, ok
}

// Placements returns the effective placement of every tenant that has a
// placement of its own, sorted by tenant. Tenants homed by the default rule
// are not listed: nothing in etcd names them.
func (m *Map) Placements() []Placement {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Placement, 0, len(m.s.placements))
	for _, p := range m.s.placements {
		p, _ = m.s.resolve(p, nil)
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}

// DefaultRegions returns the default region list (nil if none is set).
func (m *Map) DefaultRegions() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]string(nil), m.s.defaults...)
}

// RegionMoves returns every region move, sorted by region.
func (m *Map) RegionMoves() []RegionMove {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]RegionMove, 0, len(m.s.moves))
	for _, mv := range m.s.moves {
		out = append(out, m.s.move(mv))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out
}

// RegionMove returns region's move key, if any.
func (m *Map) RegionMove(region string) (RegionMove, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mv, ok := m.s.moves[region]
	if !ok {
		return RegionMove{}, false
	}
	return m.s.move(mv), true
}

// HomeRegions returns the regions that may be the effective home of some
// tenant, sorted: each region tenants are placed in (by their own key or the
// default list), followed through the region moves. It may name a region
// whose last tenant left; it never misses one that serves a tenant.
func (m *Map) HomeRegions() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	seen := map[string]bool{}
	add := func(region string, epoch int64) {
		p, _ := m.s.resolve(Placement{Region: region, Epoch: epoch}, nil)
		seen[p.Region] = true
	}
	for region, maxEpoch := range m.s.placedMax {
		// Tenants placed in region span epochs up to maxEpoch: the oldest
		// follow every move, the newest perhaps none.
		add(region, 0)
		add(region, maxEpoch)
	}
	for _, region := range m.s.defaults {
		add(region, m.s.defaultsEpoch)
	}
	out := make([]string, 0, len(seen))
	for r := range seen {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

// Nodes returns the URLs of region's live nodes, sorted.
func (m *Map) Nodes(region string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.s.nodes[region]))
	for _, u := range m.s.nodes[region] {
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
	out := make([]Node, 0, len(m.s.nodes[region]))
	for id, u := range m.s.nodes[region] {
		out = append(out, Node{ID: id, URL: u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Failover returns the failover record that applies to the tenant's
// effective placement: the region move that last moved it, or else its own
// record (from a planned move), if any.
func (m *Map) Failover(tenant string) (Failover, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, last, ok := m.s.effective(tenant)
	if ok && last != nil {
		return m.s.move(*last).Failover(tenant), true
	}
	f, ok := m.s.failovers[tenant]
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

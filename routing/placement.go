package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Placement says which region is home for a tenant, as of Epoch.
//
// A tenant is placed in a region by its own key (PlacementPrefix + tenant)
// or, without one, by the default rule (DefaultHome over the list at
// DefaultRegionsKey). Its effective home follows the region moves written
// after that placement (RegionPlacementPrefix + region): a region failover is
// one such key, whatever the number of tenants the region homes.
type Placement struct {
	Tenant string `json:"tenant"`
	// Region is the effective home: Placed, followed through every region
	// move written after the placement.
	Region string `json:"region"`
	// Epoch is the effective epoch: the ModRevision of the tenant's own key
	// (or of the default list), raised to that of each region move followed.
	// Every change of effective home has a higher epoch than the last.
	Epoch int64 `json:"epoch"`
	// Placed is the region the tenant was placed in, before region moves.
	Placed string `json:"placed,omitempty"`
	// Default is set when Placed comes from the default rule: the tenant
	// has no key of its own.
	Default bool `json:"default,omitempty"`
}

type placementValue struct {
	Region string `json:"region"`
}

// Failover records that a tenant moved between regions: written per tenant
// by MoveTenant, or derived from the RegionMove that moved it.
type Failover struct {
	Tenant string `json:"tenant"`
	From   string `json:"from"`
	To     string `json:"to"`
	// At is the failover command's wall-clock time. It only bounds the
	// uncertainty window (keys the old region accepted shortly before), which
	// is measured in hours, so clock skew of seconds does not matter.
	At time.Time `json:"at"`
	// HandedOver is set once the old region's records were merged into the
	// new region's store.
	HandedOver bool `json:"handedOver"`
	// Epoch is the placement epoch the failover wrote.
	Epoch int64 `json:"epoch"`
	// Region is set when the failover is a region's (see RegionMove): it
	// applies to every tenant homed in Region at the time.
	Region string `json:"region,omitempty"`
}

// RegionMove is a region's indirection, one key: the tenants placed in
// Region before Epoch are served by ServedBy (which may be Region itself
// again after a fail-back). A tenant placed in Region later (a planned move
// written after the region move) is not affected. Moves chain: if ServedBy
// is itself moved later, its tenants (these included) follow.
type RegionMove struct {
	Region   string `json:"region"`
	ServedBy string `json:"servedBy"`
	// From is the region that served these tenants before the move.
	From string    `json:"from"`
	At   time.Time `json:"at"`
	// HandedOver is set once From's records of the moved tenants were
	// merged into ServedBy's store (a mark at HandoverPrefix + Region).
	HandedOver bool `json:"handedOver"`
	// Epoch is the move key's ModRevision.
	Epoch int64 `json:"epoch"`
}

// Failover returns the failover record the move means for tenant.
func (mv RegionMove) Failover(tenant string) Failover {
	return Failover{Tenant: tenant, From: mv.From, To: mv.ServedBy, At: mv.At, HandedOver: mv.HandedOver, Epoch: mv.Epoch, Region: mv.Region}
}

type regionMoveValue struct {
	ServedBy string    `json:"servedBy"`
	From     string    `json:"from"`
	At       time.Time `json:"at"`
}

type handoverValue struct {
	Epoch int64 `json:"epoch"`
}

type defaultRegionsValue struct {
	Regions []string `json:"regions"`
}

// ErrRegionAlive is returned by MoveRegion while the source region still
// holds a liveness lease in etcd.
var ErrRegionAlive = errors.New("routing: region still holds a live lease")

// ErrEpochChanged is returned when a placement changed under a conditional
// write.
var ErrEpochChanged = errors.New("routing: placement epoch changed")

// ErrDefaultRegionsSet is returned by SetDefaultRegions when a different
// list is already stored: changing it would re-home every tenant without a
// placement of its own, without a failover record.
var ErrDefaultRegionsSet = errors.New("routing: a different default region list is already set")

// DefaultHome is the home of a tenant without a placement of its own: the
// region of regions with the highest hash of (region, tenant) (rendezvous
// hashing). Every node computes the same answer from the same list, in any
// order, without a write.
func DefaultHome(tenant string, regions []string) string {
	best, bestScore := "", uint64(0)
	for _, r := range regions {
		h := fnv.New64a()
		_, _ = h.Write([]byte(r))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(tenant))
		s := mix64(h.Sum64())
		if best == "" || s > bestScore || (s == bestScore && r < best) {
			best, bestScore = r, s
		}
	}
	return best
}

// mix64 is splitmix64's finalizer: FNV's low bits alone spread poorly.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// placementState is what a tenant's effective placement is computed from,
// besides its own key: the default list and the region moves.
type placementState struct {
	defaults      []string
	defaultsEpoch int64
	moves         map[string]RegionMove
}

// placed returns the tenant's placement before region moves: own if
// present, else by the default rule.
func (s *placementState) placed(tenant string, own *Placement) (Placement, bool) {
	if own != nil {
		return *own, true
	}
	if len(s.defaults) == 0 {
		return Placement{}, false
	}
	r := DefaultHome(tenant, s.defaults)
	return Placement{Tenant: tenant, Region: r, Epoch: s.defaultsEpoch, Placed: r, Default: true}, true
}

// resolve follows the region moves written after p. It returns the
// effective placement and the last move followed (nil if none); visit, if
// not nil, sees every region whose move key was consulted.
func (s *placementState) resolve(p Placement, visit func(region string)) (Placement, *RegionMove) {
	var last *RegionMove
	// Epochs strictly increase along a chain, so it ends; the bound is a
	// guard only.
	for range len(s.moves) + 1 {
		if visit != nil {
			visit(p.Region)
		}
		mv, ok := s.moves[p.Region]
		if !ok || mv.Epoch <= p.Epoch {
			break
		}
		p.Region, p.Epoch = mv.ServedBy, mv.Epoch
		last = &mv
	}
	return p, last
}

// GetPlacement reads a tenant's effective placement from etcd in one
// read (found=false if the tenant has neither a placement of its own nor a
// default home).
func GetPlacement(ctx context.Context, cli *clientv3.Client, tenant string) (Placement, bool, error) {
	own, st, err := readPlacement(ctx, cli, tenant)
	if err != nil {
		return Placement{}, false, err
	}
	p, ok := st.placed(tenant, own)
	if !ok {
		return Placement{}, false, nil
	}
	p, _ = st.resolve(p, nil)
	return p, true, nil
}

// readPlacement reads, at one revision, the tenant's own placement (nil if
// none), the default list and every region move.
func readPlacement(ctx context.Context, cli *clientv3.Client, tenant string) (*Placement, placementState, error) {
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(PlacementPrefix+tenant),
		clientv3.OpGet(DefaultRegionsKey),
		clientv3.OpGet(RegionPlacementPrefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, placementState{}, fmt.Errorf("routing: get placement: %w", err)
	}
	st := placementState{moves: map[string]RegionMove{}}
	var own *Placement
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		p, err := decodePlacement(tenant, kvs[0].Value, kvs[0].ModRevision)
		if err != nil {
			return nil, placementState{}, err
		}
		own = &p
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		if st.defaults, err = decodeDefaultRegions(kvs[0].Value); err != nil {
			return nil, placementState{}, err
		}
		st.defaultsEpoch = kvs[0].ModRevision
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		mv, err := decodeRegionMove(kv)
		if err != nil {
			return nil, placementState{}, err
		}
		st.moves[mv.Region] = mv
	}
	return own, st, nil
}

func decodePlacement(tenant string, value []byte, rev int64) (Placement, error) {
	var v placementValue
	if err := json.Unmarshal(value, &v); err != nil || v.Region == "" {
		return Placement{}, fmt.Errorf("routing: placement of %q is not {\"region\":...}: %q", tenant, value)
	}
	return Placement{Tenant: tenant, Region: v.Region, Epoch: rev, Placed: v.Region}, nil
}

func decodeRegionMove(kv *mvccpb.KeyValue) (RegionMove, error) {
	region := string(kv.Key[len(RegionPlacementPrefix):])
	var v regionMoveValue
	if err := json.Unmarshal(kv.Value, &v); err != nil || v.ServedBy == "" || region == "" {
		return RegionMove{}, fmt.Errorf("routing: region move %q is not {\"servedBy\":...}: %q", kv.Key, kv.Value)
	}
	return RegionMove{Region: region, ServedBy: v.ServedBy, From: v.From, At: v.At, Epoch: kv.ModRevision}, nil
}

func decodeDefaultRegions(value []byte) ([]string, error) {
	var v defaultRegionsValue
	if err := json.Unmarshal(value, &v); err != nil || len(v.Regions) == 0 || slices.Contains(v.Regions, "") {
		return nil, fmt.Errorf("routing: default regions are not {\"regions\":[...]}: %q", value)
	}
	return v.Regions, nil
}

// SetDefaultRegions stores the region list that homes tenants without a
// placement of their own (DefaultHome), once: the same list again is a
// no-op, another list is refused with ErrDefaultRegionsSet. It returns the
// stored list, sorted.
func SetDefaultRegions(ctx context.Context, cli *clientv3.Client, regions []string) ([]string, error) {
	regions = slices.Clone(regions)
	slices.Sort(regions)
	regions = slices.Compact(regions)
	if len(regions) == 0 || regions[0] == "" {
		return nil, errors.New("routing: default regions: want a non-empty list of region names")
	}
	val, _ := json.Marshal(defaultRegionsValue{Regions: regions})
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(DefaultRegionsKey), "=", 0)).
		Then(clientv3.OpPut(DefaultRegionsKey, string(val))).
		Else(clientv3.OpGet(DefaultRegionsKey)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("routing: set default regions: %w", err)
	}
	if resp.Succeeded {
		return regions, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, fmt.Errorf("routing: set default regions: %w", ErrEpochChanged)
	}
	cur, err := decodeDefaultRegions(kvs[0].Value)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(cur, regions) {
		return cur, fmt.Errorf("routing: default regions are %v: %w", cur, ErrDefaultRegionsSet)
	}
	return cur, nil
}

// GetDefaultRegions reads the default region list (nil if none is set).
func GetDefaultRegions(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	resp, err := cli.Get(ctx, DefaultRegionsKey)
	if err != nil {
		return nil, fmt.Errorf("routing: get default regions: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return decodeDefaultRegions(resp.Kvs[0].Value)
}

// SetPlacement makes region home for tenant and returns the new placement
// (with its new, higher epoch: it overrides every earlier region move). It is
// the operator's manual move; it does not check that the old region has
// stopped serving (see MoveRegion for that).
func SetPlacement(ctx context.Context, cli *clientv3.Client, tenant, region string) (Placement, error) {
	val, _ := json.Marshal(placementValue{Region: region})
	resp, err := cli.Put(ctx, PlacementPrefix+tenant, string(val))
	if err != nil {
		return Placement{}, fmt.Errorf("routing: set placement: %w", err)
	}
	return Placement{Tenant: tenant, Region: region, Epoch: resp.Header.Revision, Placed: region}, nil
}

// ClaimPlacement makes region home for tenant if the tenant has no placement
// key yet (one atomic create), and returns the tenant's own placement either
// way. Routers use it only where no default region list is set.
func ClaimPlacement(ctx context.Context, cli *clientv3.Client, tenant, region string) (Placement, error) {
	key := PlacementPrefix + tenant
	val, _ := json.Marshal(placementValue{Region: region})
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return Placement{}, fmt.Errorf("routing: claim placement: %w", err)
	}
	if resp.Succeeded {
		return Placement{Tenant: tenant, Region: region, Epoch: resp.Header.Revision, Placed: region}, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Placement{}, fmt.Errorf("routing: claim placement of %q: %w", tenant, ErrEpochChanged)
	}
	return decodePlacement(tenant, kvs[0].Value, kvs[0].ModRevision)
}

// RegionAlive reports whether any node of region holds a liveness key.
func RegionAlive(ctx context.Context, cli *clientv3.Client, region string) (bool, error) {
	resp, err := cli.Get(ctx, RegionNodesPrefix(region), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("routing: region liveness: %w", err)
	}
	return resp.Count > 0, nil
}

// noLiveNode is the comparison "region has no node key".
func noLiveNode(region string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(RegionNodesPrefix(region)), "=", 0).WithPrefix()
}

// GetRegionMove reads a region's move key (found=false if none).
func GetRegionMove(ctx context.Context, cli *clientv3.Client, region string) (RegionMove, bool, error) {
	resp, err := cli.Get(ctx, RegionPlacementPrefix+region)
	if err != nil {
		return RegionMove{}, false, fmt.Errorf("routing: get region move: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return RegionMove{}, false, nil
	}
	mv, err := decodeRegionMove(resp.Kvs[0])
	return mv, err == nil, err
}

// MoveRegion fails region from over to region to: every tenant whose
// effective home is from (placed there, by its own key or the default rule,
// or moved there by an earlier region move) is served by to from now on. It
// writes one key, RegionPlacementPrefix + from, in one conditional
// transaction, whatever the number of tenants: its ModRevision is their new
// epoch, and the move is their failover record.
//
// It refuses with ErrRegionAlive while from still has a live node: a region
// must have stopped serving (its lease expired in etcd, or released) before
// anyone else may serve its tenants. If from's tenants are served by a third
// region after an earlier move, that region must have no live node either.
// The transaction re-checks both and that from's move key is unchanged.
func MoveRegion(ctx context.Context, cli *clientv3.Client, from, to string, now time.Time) (RegionMove, error) {
	if from == to || from == "" || to == "" {
		return RegionMove{}, fmt.Errorf("routing: move %q to %q", from, to)
	}
	key := RegionPlacementPrefix + from
	cur, found, err := GetRegionMove(ctx, cli, from)
	if err != nil {
		return RegionMove{}, err
	}
	prev := from
	if found {
		prev = cur.ServedBy
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", cur.Epoch), noLiveNode(from)}
	if prev != from && prev != to {
		cmps = append(cmps, noLiveNode(prev))
	}
	if prev == to {
		// Moved to to before: what moves now are the tenants placed in from
		// since, so from's records are the ones to hand over.
		prev = from
	}
	mv := RegionMove{Region: from, ServedBy: to, From: prev, At: now.UTC()}
	val, _ := json.Marshal(regionMoveValue{ServedBy: to, From: prev, At: mv.At})
	// Else reads the key in the transaction itself: unchanged means a
	// liveness check failed, whatever the regions' leases did since.
	resp, err := cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(key, string(val))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return RegionMove{}, fmt.Errorf("routing: move %s -> %s: %w", from, to, err)
	}
	if !resp.Succeeded {
		var rev int64
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			rev = kvs[0].ModRevision
		}
		if rev != cur.Epoch {
			return RegionMove{}, fmt.Errorf("routing: move %s -> %s: %w", from, to, ErrEpochChanged)
		}
		alive := from
		if prev != from {
			if a, err := RegionAlive(ctx, cli, prev); err == nil && a {
				alive = prev
			}
		}
		return RegionMove{}, fmt.Errorf("routing: move %s -> %s: %s: %w", from, to, alive, ErrRegionAlive)
	}
	mv.Epoch = resp.Header.Revision
	return mv, nil
}

// FailBack makes region serve its own tenants again after a MoveRegion: one
// key, with a new epoch, so the region that served them stops as soon as it
// sees it. Like MoveTenant it is a planned move: it does not wait for the
// serving region to stop. The returned move's From is that region: region
// treats keys it has no record of as uncertain until From's records are
// handed over (or the window ends). Tenants placed elsewhere since are not
// affected.
func FailBack(ctx context.Context, cli *clientv3.Client, region string, now time.Time) (RegionMove, error) {
	cur, found, err := GetRegionMove(ctx, cli, region)
	if err != nil {
		return RegionMove{}, err
	}
	if !found || cur.ServedBy == region {
		return cur, fmt.Errorf("routing: region %s serves its own tenants already", region)
	}
	key := RegionPlacementPrefix + region
	mv := RegionMove{Region: region, ServedBy: region, From: cur.ServedBy, At: now.UTC()}
	val, _ := json.Marshal(regionMoveValue{ServedBy: region, From: cur.ServedBy, At: mv.At})
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.Epoch)).
		Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return RegionMove{}, fmt.Errorf("routing: fail back %s: %w", region, err)
	}
	if !resp.Succeeded {
		return RegionMove{}, fmt.Errorf("routing: fail back %s: %w", region, ErrEpochChanged)
	}
	mv.Epoch = resp.Header.Revision
	return mv, nil
}

// MarkRegionHandedOver records that mv.From's records of the tenants mv
// moved were merged into mv.ServedBy's store, ending their uncertainty
// window early. It is one key for the region; a later move of the region is
// not covered by it.
func MarkRegionHandedOver(ctx context.Context, cli *clientv3.Client, mv RegionMove) error {
	val, _ := json.Marshal(handoverValue{Epoch: mv.Epoch})
	if _, err := cli.Put(ctx, HandoverPrefix+mv.Region, string(val)); err != nil {
		return fmt.Errorf("routing: mark %s handed over: %w", mv.Region, err)
	}
	return nil
}

// MoveTenant makes to home for tenant: the operator's planned move. Its new
// placement key overrides the default rule and every earlier region move. A
// tenant that changes region gets a failover record in the same
// transaction, so its new home treats keys it has no record of as uncertain
// until the old region's records are handed over (or the window ends); the
// old region's nodes stop serving the tenant as soon as they see the new
// epoch. The write is conditional on everything the old home was computed
// from.
func MoveTenant(ctx context.Context, cli *clientv3.Client, tenant, to string, now time.Time) (Placement, error) {
	own, st, err := readPlacement(ctx, cli, tenant)
	if err != nil {
		return Placement{}, err
	}
	key := PlacementPrefix + tenant
	var ownRev int64
	if own != nil {
		ownRev = own.Epoch
	}
	placed, ok := st.placed(tenant, own)
	if !ok {
		// Unplaced and no default rule: a first placement, no failover.
		val, _ := json.Marshal(placementValue{Region: to})
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(DefaultRegionsKey), "=", 0)).
			Then(clientv3.OpPut(key, string(val))).Commit()
		if err != nil {
			return Placement{}, fmt.Errorf("routing: place %s: %w", tenant, err)
		}
		if !resp.Succeeded {
			return Placement{}, fmt.Errorf("routing: place %s: %w", tenant, ErrEpochChanged)
		}
		return Placement{Tenant: tenant, Region: to, Epoch: resp.Header.Revision, Placed: to}, nil
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", ownRev),
		clientv3.Compare(clientv3.ModRevision(DefaultRegionsKey), "=", st.defaultsEpoch)}
	cur, _ := st.resolve(placed, func(region string) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(RegionPlacementPrefix+region), "=", st.moves[region].Epoch))
	})
	if cur.Region == to {
		return cur, nil
	}
	val, _ := json.Marshal(placementValue{Region: to})
	f := Failover{Tenant: tenant, From: cur.Region, To: to, At: now.UTC()}
	fv, _ := json.Marshal(f)
	resp, err := cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpPut(key, string(val)), clientv3.OpPut(FailoverPrefix+tenant, string(fv))).
		Commit()
	if err != nil {
		return Placement{}, fmt.Errorf("routing: move %s: %w", tenant, err)
	}
	if !resp.Succeeded {
		return Placement{}, fmt.Errorf("routing: move %s: %w", tenant, ErrEpochChanged)
	}
	// The failover record's epoch is the transaction's revision, which is
	// also the placement's new ModRevision.
	return Placement{Tenant: tenant, Region: to, Epoch: resp.Header.Revision, Placed: to}, nil
}

// MarkHandedOver records that the old region's records of tenant were merged
// into its new home's store, ending the uncertainty window of its own
// failover record (see MarkRegionHandedOver for a region's).
func MarkHandedOver(ctx context.Context, cli *clientv3.Client, tenant string) error {
	resp, err := cli.Get(ctx, FailoverPrefix+tenant)
	if err != nil {
		return fmt.Errorf("routing: get failover: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("routing: tenant %q has no failover record", tenant)
	}
	var f Failover
	if err := json.Unmarshal(resp.Kvs[0].Value, &f); err != nil {
		return fmt.Errorf("routing: decode failover: %w", err)
	}
	if f.Epoch == 0 {
		f.Epoch = resp.Kvs[0].ModRevision
	}
	f.HandedOver = true
	val, _ := json.Marshal(f)
	if _, err := cli.Put(ctx, FailoverPrefix+tenant, string(val)); err != nil {
		return fmt.Errorf("routing: mark handed over: %w", err)
	}
	return nil
}

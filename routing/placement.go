package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Placement says which region is home for a tenant, as of Epoch (the
// placement key's ModRevision: a later placement always has a higher epoch).
type Placement struct {
	Tenant string `json:"tenant"`
	Region string `json:"region"`
	Epoch  int64  `json:"epoch"`
}

type placementValue struct {
	Region string `json:"region"`
}

// Failover records that a tenant moved between regions.
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
}

// ErrRegionAlive is returned by MoveRegion while the source region still
// holds a liveness lease in etcd.
var ErrRegionAlive = errors.New("routing: region still holds a live lease")

// ErrEpochChanged is returned when a placement changed under a conditional
// write.
var ErrEpochChanged = errors.New("routing: placement epoch changed")

// GetPlacement reads a tenant's placement from etcd (found=false if none).
func GetPlacement(ctx context.Context, cli *clientv3.Client, tenant string) (Placement, bool, error) {
	resp, err := cli.Get(ctx, PlacementPrefix+tenant)
	if err != nil {
		return Placement{}, false, fmt.Errorf("routing: get placement: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Placement{}, false, nil
	}
	p, err := decodePlacement(tenant, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	return p, err == nil, err
}

func decodePlacement(tenant string, value []byte, rev int64) (Placement, error) {
	var v placementValue
	if err := json.Unmarshal(value, &v); err != nil || v.Region == "" {
		return Placement{}, fmt.Errorf("routing: placement of %q is not {\"region\":...}: %q", tenant, value)
	}
	return Placement{Tenant: tenant, Region: v.Region, Epoch: rev}, nil
}

// SetPlacement makes region home for tenant and returns the new placement
// (with its new, higher epoch). It is the operator's manual move; it does not
// check that the old region has stopped serving (see MoveRegion for that).
func SetPlacement(ctx context.Context, cli *clientv3.Client, tenant, region string) (Placement, error) {
	val, _ := json.Marshal(placementValue{Region: region})
	resp, err := cli.Put(ctx, PlacementPrefix+tenant, string(val))
	if err != nil {
		return Placement{}, fmt.Errorf("routing: set placement: %w", err)
	}
	return Placement{Tenant: tenant, Region: region, Epoch: resp.Header.Revision}, nil
}

// ClaimPlacement makes region home for tenant if the tenant has no placement
// yet (one atomic create), and returns the tenant's placement either way.
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
		return Placement{Tenant: tenant, Region: region, Epoch: resp.Header.Revision}, nil
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

// MoveRegion moves every tenant whose home is from to to, writing each new
// placement (a higher epoch) together with a Failover record, in one
// conditional transaction per tenant. It refuses with ErrRegionAlive while
// from still has a live node: a region must have stopped serving (its lease
// expired in etcd, or released) before anyone else may serve its tenants.
func MoveRegion(ctx context.Context, cli *clientv3.Client, from, to string, now time.Time) ([]Failover, error) {
	if from == to {
		return nil, fmt.Errorf("routing: move %s to itself", from)
	}
	alive, err := RegionAlive(ctx, cli, from)
	if err != nil {
		return nil, err
	}
	if alive {
		return nil, fmt.Errorf("routing: move %s -> %s: %w", from, to, ErrRegionAlive)
	}
	resp, err := cli.Get(ctx, PlacementPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("routing: list placements: %w", err)
	}
	var moved []Failover
	for _, kv := range resp.Kvs {
		tenant := string(kv.Key[len(PlacementPrefix):])
		p, err := decodePlacement(tenant, kv.Value, kv.ModRevision)
		if err != nil || p.Region != from {
			continue
		}
		f, err := moveTenant(ctx, cli, p, to, now)
		if err != nil {
			return moved, err
		}
		moved = append(moved, f)
	}
	return moved, nil
}

// moveTenant writes the new placement and its failover record, provided the
// placement is still p and the source region is still without a live node.
func moveTenant(ctx context.Context, cli *clientv3.Client, p Placement, to string, now time.Time) (Failover, error) {
	return writeMove(ctx, cli, p, to, now, clientv3.Compare(clientv3.CreateRevision(RegionNodesPrefix(p.Region)), "=", 0).WithPrefix())
}

// writeMove writes placement p -> to and its failover record in one
// transaction, if the placement is still p and every extra comparison holds.
func writeMove(ctx context.Context, cli *clientv3.Client, p Placement, to string, now time.Time, extra ...clientv3.Cmp) (Failover, error) {
	key := PlacementPrefix + p.Tenant
	val, _ := json.Marshal(placementValue{Region: to})
	f := Failover{Tenant: p.Tenant, From: p.Region, To: to, At: now.UTC()}
	fv, _ := json.Marshal(f)
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", p.Epoch)}, extra...)
	resp, err := cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpPut(key, string(val)), clientv3.OpPut(FailoverPrefix+p.Tenant, string(fv))).
		Commit()
	if err != nil {
		return Failover{}, fmt.Errorf("routing: move %s: %w", p.Tenant, err)
	}
	if !resp.Succeeded {
		return Failover{}, fmt.Errorf("routing: move %s: %w", p.Tenant, ErrEpochChanged)
	}
	// The failover record's epoch is the transaction's revision, which is
	// also the placement's new ModRevision.
	f.Epoch = resp.Header.Revision
	return f, nil
}

// MoveTenant makes to home for tenant: the operator's planned move. A tenant
// without a placement is simply placed. A tenant that changes region gets a
// failover record in the same transaction, so its new home treats keys it
// has no record of as uncertain until the old region's records are handed
// over (or the window ends); the old region's nodes stop serving the tenant
// as soon as they see the new epoch.
func MoveTenant(ctx context.Context, cli *clientv3.Client, tenant, to string, now time.Time) (Placement, error) {
	cur, ok, err := GetPlacement(ctx, cli, tenant)
	if err != nil {
		return Placement{}, err
	}
	if !ok {
		return SetPlacement(ctx, cli, tenant, to)
	}
	if cur.Region == to {
		return cur, nil
	}
	f, err := writeMove(ctx, cli, cur, to, now)
	if err != nil {
		return Placement{}, err
	}
	return Placement{Tenant: tenant, Region: to, Epoch: f.Epoch}, nil
}

// MarkHandedOver records that the old region's records of tenant were merged
// into its new home's store, ending the uncertainty window early.
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

package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem"
)

// StoreMode is how regions share idempotency records.
type StoreMode string

// Store modes.
const (
	// RegionLocal: each region has its own store; a tenant's records live in
	// its home region's store and requests are forwarded there.
	RegionLocal StoreMode = "region-local"
	// Global: every region writes to one strongly consistent store
	// (CockroachDB); no forwarding is needed for correctness.
	Global StoreMode = "global"
)

// ParseStoreMode parses a --store-mode value.
func ParseStoreMode(s string) (StoreMode, error) {
	switch StoreMode(s) {
	case RegionLocal, Global:
		return StoreMode(s), nil
	}
	return "", fmt.Errorf("routing: unknown store mode %q (want %s or %s)", s, RegionLocal, Global)
}

// Lease is what the router needs of the node's liveness lease (a
// *Membership): whether its local deadline has passed, and the etcd revision
// of the node's latest registration.
type Lease interface {
	Valid() bool
	ServingFrom() int64
}

// Route is where a request for a tenant must be served.
type Route struct {
	Placement Placement
	// ForwardTo is the base URL of a home-region node to forward to; empty
	// means serve here.
	ForwardTo string
	// ForwardNode is the node ForwardTo belongs to, in the home region
	// (Placement.Region): the identity its certificate must carry.
	ForwardNode string
	// Uncertain is true when the tenant failed over to this region within
	// the replay window and the old region's records were not handed over
	// yet: a key this region has no record of may have been accepted by the
	// old region, so it must be reconciled downstream before it executes.
	Uncertain bool
}

// RouterConfig configures a Router.
type RouterConfig struct {
	Region string
	Mode   StoreMode
	// RouteToHome forwards to the home region in Global mode too (a latency
	// choice: with REGIONAL BY ROW the row's leaseholder is in its home
	// region, so the home region's reads are local and, under SURVIVE ZONE
	// FAILURE, so are its writes; see deploy/cockroach).
	RouteToHome bool
	// Window is the replay window (bounds the uncertainty after a failover).
	Window time.Duration
	// Now is the node's clock (only used against failover times). Default
	// time.Now.
	Now func() time.Time
}

// Router decides, per tenant, whether this node serves a request or forwards
// it to the tenant's home region.
type Router struct {
	cli   *clientv3.Client
	m     *Map
	lease Lease
	cfg   RouterConfig
}

// NewRouter returns a Router over the map m, serving home tenants while
// lease is valid.
func NewRouter(cli *clientv3.Client, m *Map, lease Lease, cfg RouterConfig) *Router {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Mode == "" {
		cfg.Mode = RegionLocal
	}
	return &Router{cli: cli, m: m, lease: lease, cfg: cfg}
}

// Map returns the router's map.
func (r *Router) Map() *Map { return r.m }

// Region returns the router's region.
func (r *Router) Region() string { return r.cfg.Region }

// Mode returns the store mode.
func (r *Router) Mode() StoreMode { return r.cfg.Mode }

// Ready reports whether this node can serve its region's tenants now: its
// region holds its lease and the node's map has caught up with its latest
// registration (a placement may have moved while it was away). A node in
// global mode that serves every tenant where it stands is always ready. The
// error is an *idem.Error with code TENANT_NOT_SERVED_HERE; /readyz answers
// with it, so a load balancer stops sending traffic to a node that would
// only refuse or wait.
func (r *Router) Ready() error {
	if r.cfg.Mode == Global && !r.cfg.RouteToHome {
		return nil
	}
	if r.lease == nil || !r.lease.Valid() {
		return idem.Errorf(idem.ECodeNotHome, "Region %s does not hold its lease; it is not serving its tenants now.", r.cfg.Region)
	}
	if r.m.Revision() < r.lease.ServingFrom() {
		return idem.Errorf(idem.ECodeNotHome, "Region %s is catching up with the control plane; retry later.", r.cfg.Region)
	}
	return nil
}

// Route decides where tenant's request is served, from the map alone when
// it knows the tenant's effective placement. A tenant without a placement
// of its own has its default home (DefaultHome over the stored default
// region list): no write. Only where no default list is set is it placed in
// this node's region (one atomic create in etcd, as before such lists).
// Errors are *idem.Error with code TENANT_NOT_SERVED_HERE when this node may
// not serve and cannot forward.
func (r *Router) Route(ctx context.Context, tenant string) (Route, error) {
	p, ok := r.m.Placement(tenant)
	if !ok {
		var err error
		if p, err = ClaimPlacement(ctx, r.cli, tenant, r.cfg.Region); err != nil {
			return Route{}, &idem.Error{Code: idem.ECodeUnavailable, Message: "The control plane is unavailable; retry with the same key.", Err: err}
		}
	}
	rt := Route{Placement: p}
	home := p.Region == r.cfg.Region
	if r.cfg.Mode == Global && (!r.cfg.RouteToHome || home) {
		return rt, nil
	}
	if !home {
		nodes := r.m.NodeList(p.Region)
		if len(nodes) == 0 {
			// The map may lag a failover that just moved the tenant: ask
			// etcd before refusing.
			if fresh, ok, err := GetPlacement(ctx, r.cli, tenant); err == nil && ok && fresh.Epoch > p.Epoch {
				if err := r.m.WaitRevision(ctx, fresh.Epoch); err == nil {
					return r.Route(ctx, tenant)
				}
			}
			if r.cfg.Mode == Global {
				return rt, nil // the global store is safe anywhere
			}
			return Route{}, idem.Errorf(idem.ECodeNotHome, "The home region %s of this tenant has no live node; retry later.", p.Region)
		}
		n := nodes[rand.IntN(len(nodes))]
		rt.ForwardTo, rt.ForwardNode = n.URL, n.ID
		return rt, nil
	}
	if r.lease == nil || !r.lease.Valid() {
		return Route{}, idem.Errorf(idem.ECodeNotHome, "Region %s does not hold its lease; it is not serving its tenants now.", r.cfg.Region)
	}
	// The node serves home tenants only once its map has caught up with its
	// latest registration (a placement may have moved while it was away).
	if from := r.lease.ServingFrom(); r.m.Revision() < from {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := r.m.WaitRevision(wctx, from); err != nil {
			return Route{}, idem.Errorf(idem.ECodeNotHome, "Region %s is catching up with the control plane; retry later.", r.cfg.Region)
		}
		// The placement may have moved while we were catching up.
		if p2, ok := r.m.Placement(tenant); ok && p2.Region != r.cfg.Region {
			return r.Route(ctx, tenant)
		}
	}
	if f, ok := r.m.Failover(tenant); ok && f.To == r.cfg.Region && !f.HandedOver && r.cfg.Now().Sub(f.At) < r.cfg.Window {
		rt.Uncertain = true
	}
	return rt, nil
}

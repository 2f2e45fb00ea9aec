package routing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newMap(t *testing.T, cli *clientv3.Client) *routing.Map {
	t.Helper()
	m, err := routing.NewMap(ctxFor(t), cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func join(t *testing.T, cli *clientv3.Client, region, id string) *routing.Membership {
	t.Helper()
	m, err := routing.Join(ctxFor(t), cli, region, id, "http://"+id+".invalid", 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPlacementEpochs: every change of home has a higher epoch; a claim only
// creates; the watched map follows.
func TestPlacementEpochs(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	m := newMap(t, cli)

	p1, err := routing.ClaimPlacement(ctx, cli, "t1", "eu-west")
	if err != nil || p1.Region != "eu-west" {
		t.Fatalf("claim = %+v, %v", p1, err)
	}
	again, err := routing.ClaimPlacement(ctx, cli, "t1", "us-east")
	if err != nil || again != p1 {
		t.Errorf("second claim = %+v, %v; want the first placement %+v unchanged", again, err, p1)
	}
	p2, err := routing.SetPlacement(ctx, cli, "t1", "us-east")
	if err != nil || p2.Epoch <= p1.Epoch {
		t.Fatalf("set = %+v, %v; want an epoch above %d", p2, err, p1.Epoch)
	}
	waitFor(t, "map to see the move", func() bool {
		p, ok := m.Placement("t1")
		return ok && p == p2
	})
	got, ok, err := routing.GetPlacement(ctx, cli, "t1")
	if err != nil || !ok || got != p2 {
		t.Errorf("GetPlacement = %+v %v %v", got, ok, err)
	}
}

// TestConcurrentClaimsAgree: many nodes placing a new tenant at once all end
// with the same home.
func TestConcurrentClaimsAgree(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	regions := []string{"eu-west", "us-east", "ap-south"}
	var wg sync.WaitGroup
	got := make([]routing.Placement, 12)
	for i := range got {
		wg.Go(func() {
			p, err := routing.ClaimPlacement(context.Background(), cli, "new-tenant", regions[i%3])
			if err != nil {
				t.Error(err)
			}
			got[i] = p
		})
	}
	wg.Wait()
	for _, p := range got[1:] {
		if p != got[0] {
			t.Fatalf("claims disagree: %+v vs %+v", p, got[0])
		}
	}
}

// TestRouterServesForwardsOrRefuses: the home region serves while its lease
// holds; another region forwards to a live home node; nobody serves a home
// region without a live node.
func TestRouterServesForwardsOrRefuses(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	m := newMap(t, cli)
	eu := join(t, cli, "eu-west", "eu-1")
	us := join(t, cli, "us-east", "us-1")
	if _, err := routing.SetPlacement(ctx, cli, "t1", "eu-west"); err != nil {
		t.Fatal(err)
	}
	euRouter := routing.NewRouter(cli, m, eu, routing.RouterConfig{Region: "eu-west", Window: time.Hour})
	usRouter := routing.NewRouter(cli, m, us, routing.RouterConfig{Region: "us-east", Window: time.Hour})
	waitFor(t, "map to see nodes and placement", func() bool {
		_, ok := m.Placement("t1")
		return ok && len(m.Nodes("eu-west")) == 1 && len(m.Nodes("us-east")) == 1
	})

	rt, err := euRouter.Route(ctx, "t1")
	if err != nil || rt.ForwardTo != "" || rt.Uncertain {
		t.Errorf("home route = %+v, %v; want serve here", rt, err)
	}
	rt, err = usRouter.Route(ctx, "t1")
	if err != nil || rt.ForwardTo != "http://eu-1.invalid" {
		t.Errorf("remote route = %+v, %v; want forward to eu-1", rt, err)
	}
	// An unplaced tenant becomes the receiving region's.
	if rt, err := usRouter.Route(ctx, "fresh"); err != nil || rt.Placement.Region != "us-east" || rt.ForwardTo != "" {
		t.Errorf("unplaced tenant = %+v, %v", rt, err)
	}
	// Global mode needs no forwarding.
	global := routing.NewRouter(cli, m, us, routing.RouterConfig{Region: "us-east", Mode: routing.Global})
	if rt, err := global.Route(ctx, "t1"); err != nil || rt.ForwardTo != "" {
		t.Errorf("global route = %+v, %v; want serve here", rt, err)
	}
	// The home region's only node leaves: nobody may serve t1 (region-local).
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "eu-west to have no node", func() bool { return len(m.Nodes("eu-west")) == 0 })
	_, err = usRouter.Route(ctx, "t1")
	if code := idem.ErrorCode(err); code != idem.ECodeNotHome {
		t.Errorf("route with dead home = %v, want %s", err, idem.ECodeNotHome)
	}
	if _, err := euRouter.Route(ctx, "t1"); idem.ErrorCode(err) != idem.ECodeNotHome {
		t.Errorf("home node without a lease served: %v", err)
	}
}

// TestFailoverWaitsForTheOldRegion: a failover refuses while the old region
// holds a live lease, then moves its tenants with higher epochs, marks them
// uncertain on the new home until handed over.
func TestFailoverWaitsForTheOldRegion(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	m := newMap(t, cli)
	eu := join(t, cli, "eu-west", "eu-1")
	us := join(t, cli, "us-east", "us-1")
	before := map[string]routing.Placement{}
	for i := range 3 {
		p, err := routing.SetPlacement(ctx, cli, fmt.Sprintf("t%d", i), "eu-west")
		if err != nil {
			t.Fatal(err)
		}
		before[p.Tenant] = p
	}
	if _, err := routing.SetPlacement(ctx, cli, "other", "us-east"); err != nil {
		t.Fatal(err)
	}
	if _, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now()); !errors.Is(err, routing.ErrRegionAlive) {
		t.Fatalf("failover of a live region = %v, want ErrRegionAlive", err)
	}
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	moved, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now())
	if err != nil || moved.Region != "eu-west" || moved.From != "eu-west" || moved.ServedBy != "us-east" {
		t.Fatalf("failover = %+v, %v; want eu-west served by us-east", moved, err)
	}
	for tenant, b := range before {
		p, ok, err := routing.GetPlacement(ctx, cli, tenant)
		if err != nil || !ok || p.Region != "us-east" || p.Epoch <= b.Epoch || p.Epoch != moved.Epoch {
			t.Errorf("moved %+v, before %+v (%v)", p, b, err)
		}
	}
	if p, _, _ := routing.GetPlacement(ctx, cli, "other"); p.Region != "us-east" {
		t.Errorf("other = %+v", p)
	}
	usRouter := routing.NewRouter(cli, m, us, routing.RouterConfig{Region: "us-east", Window: time.Hour})
	waitFor(t, "map to see the failover", func() bool {
		_, ok := m.Failover("t0")
		p, _ := m.Placement("t0")
		return ok && p.Region == "us-east"
	})
	rt, err := usRouter.Route(ctx, "t0")
	if err != nil || rt.ForwardTo != "" || !rt.Uncertain {
		t.Errorf("route of a moved tenant = %+v, %v; want served here, uncertain", rt, err)
	}
	if rt, _ := usRouter.Route(ctx, "other"); rt.Uncertain {
		t.Error("a tenant that never moved is uncertain")
	}
	if err := routing.MarkRegionHandedOver(ctx, cli, moved); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "handover to be seen", func() bool { f, _ := m.Failover("t0"); return f.HandedOver })
	if rt, _ := usRouter.Route(ctx, "t0"); rt.Uncertain {
		t.Error("still uncertain after the handover")
	}
	late := routing.NewRouter(cli, m, us, routing.RouterConfig{Region: "us-east", Window: time.Hour, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if rt, _ := late.Route(ctx, "t1"); rt.Uncertain {
		t.Error("still uncertain after the replay window")
	}
}

// TestMembershipRejoinsAfterLeaseLoss: a revoked lease makes the node stop
// serving, then it re-joins with a new registration.
func TestMembershipRejoinsAfterLeaseLoss(t *testing.T) {
	ctx := ctxFor(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	eu := join(t, cli, "eu-west", "eu-1")
	first := eu.ServingFrom()
	resp, err := cli.Get(ctx, routing.NodeKey("eu-west", "eu-1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node key: %v %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "re-join", func() bool { return eu.ServingFrom() > first && eu.Valid() })
	alive, err := routing.RegionAlive(ctx, cli, "eu-west")
	if err != nil || !alive {
		t.Errorf("region alive after re-join = %v, %v", alive, err)
	}
	lock, err := eu.TryLock(ctx, "t/op/k")
	if err != nil || lock.Token() <= first {
		t.Errorf("lock after re-join = %v, %v", lock, err)
	}
}

// TestAutoFailover: a region without a live node for the configured time has
// its tenants moved to the elected node's region; a live region never does.
func TestAutoFailover(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	m := newMap(t, cli)
	eu := join(t, cli, "eu-west", "eu-1")
	join(t, cli, "us-east", "us-1")
	for _, tc := range []struct{ tenant, region string }{{"a", "eu-west"}, {"b", "us-east"}} {
		if _, err := routing.SetPlacement(ctx, cli, tc.tenant, tc.region); err != nil {
			t.Fatal(err)
		}
	}
	moved := make(chan routing.RegionMove, 4)
	// The leader's checks are driven by ticks the test sends, carrying the
	// times of a clock the test moves: a send returns once the leader has
	// taken the tick, and the next send once it has finished with it.
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	ticks := make(chan time.Time)
	af := &routing.AutoFailover{Client: cli, Map: m, Region: "us-east", After: 1500 * time.Millisecond,
		Ticks: ticks, Now: clock, OnMove: func(mv routing.RegionMove) { moved <- mv }}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = af.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	tick := func() {
		t.Helper()
		select {
		case ticks <- clock():
		case <-ctx.Done():
			t.Fatal("the automatic failover never took a tick (not elected?)")
		}
	}

	// The map has seen both regions' nodes and the placements.
	if err := m.WaitRevision(ctx, revision(t, cli)); err != nil {
		t.Fatal(err)
	}
	// Every region alive, for twice After: no move.
	for range 4 {
		tick()
		advance(time.Second)
	}
	tick()
	select {
	case f := <-moved:
		t.Fatalf("moved %+v while every region was alive", f)
	default:
	}
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitRevision(ctx, revision(t, cli)); err != nil {
		t.Fatal(err)
	}
	if n := m.Nodes("eu-west"); len(n) > 0 {
		t.Fatalf("eu-west's node left, the map still lists %v", n)
	}
	// Dead, but not yet for After: no move.
	tick()
	advance(time.Second)
	tick()
	tick()
	select {
	case f := <-moved:
		t.Fatalf("moved %+v after 1s without a node; After is 1.5s", f)
	default:
	}
	// Dead for After: moved, once.
	advance(time.Second)
	tick()
	tick()
	select {
	case f := <-moved:
		if f.Region != "eu-west" || f.ServedBy != "us-east" {
			t.Errorf("moved %+v, want eu-west -> us-east", f)
		}
		if p, _, _ := routing.GetPlacement(ctx, cli, "a"); p.Region != "us-east" {
			t.Errorf("a is in %s after the automatic failover", p.Region)
		}
	default:
		t.Fatal("no automatic failover of a region dead for After")
	}
	if p, _, _ := routing.GetPlacement(ctx, cli, "b"); p.Region != "us-east" {
		t.Errorf("b moved to %s", p.Region)
	}
}

// TestMoveTenantRecordsAFailover: a planned move of a placed tenant writes a
// failover record with the new epoch; a first placement does not.
func TestMoveTenantRecordsAFailover(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	first, err := routing.MoveTenant(ctx, cli, "t", "eu-west", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if resp, _ := cli.Get(ctx, routing.FailoverPrefix+"t"); len(resp.Kvs) != 0 {
		t.Error("a first placement wrote a failover record")
	}
	same, err := routing.MoveTenant(ctx, cli, "t", "eu-west", time.Now())
	if err != nil || same != first {
		t.Errorf("move to the same region = %+v, %v; want unchanged %+v", same, err, first)
	}
	moved, err := routing.MoveTenant(ctx, cli, "t", "us-east", time.Now())
	if err != nil || moved.Epoch <= first.Epoch || moved.Region != "us-east" {
		t.Fatalf("move = %+v, %v", moved, err)
	}
	m := newMap(t, cli)
	f, ok := m.Failover("t")
	if !ok || f.From != "eu-west" || f.To != "us-east" || f.Epoch != moved.Epoch {
		t.Errorf("failover record = %+v %v", f, ok)
	}
}

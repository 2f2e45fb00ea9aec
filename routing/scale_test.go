package routing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/routing"
)

// txnOps is how many puts placeTenants batches into one transaction
// (etcd's default --max-txn-ops).
const txnOps = 128

// placeTenants gives n tenants ("<prefix>-<i>") their own placement in
// region, many puts per transaction, and returns their names.
func placeTenants(tb testing.TB, cli *clientv3.Client, prefix, region string, n int) []string {
	tb.Helper()
	val, _ := json.Marshal(map[string]string{"region": region})
	tenants := make([]string, n)
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			tb.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range n {
		tenants[i] = fmt.Sprintf("%s-%07d", prefix, i)
		ops = append(ops, clientv3.OpPut(routing.PlacementPrefix+tenants[i], string(val)))
		if len(ops) == txnOps {
			flush()
		}
	}
	flush()
	return tenants
}

func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(ctxFor(t), "/idem/never-written")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestRegionFailoverIsConstant: moving a region that homes 10,000 tenants
// writes one revision, and a watching node receives one event; every
// tenant is then served by the new region, uncertain there, at a higher
// epoch.
func TestRegionFailoverIsConstant(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	const n = 10_000
	tenants := placeTenants(t, cli, "eu", "eu-west", n)
	placeTenants(t, cli, "us", "us-east", 10)
	eu := join(t, cli, "eu-west", "eu-1")
	us := join(t, cli, "us-east", "us-1")
	m := newMap(t, cli)
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}

	before := revision(t, cli)
	events := cli.Watch(ctx, "/idem/", clientv3.WithPrefix(), clientv3.WithRev(before+1))
	if _, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now()); err != nil {
		t.Fatal(err)
	}
	after := revision(t, cli)
	if after-before != 1 {
		t.Fatalf("a failover of %d tenants took %d revisions, want 1", n, after-before)
	}
	got := 0
	for resp := range events {
		got += len(resp.Events)
		if resp.Header.Revision >= after {
			break
		}
	}
	if got != 1 {
		t.Errorf("a watching node received %d events, want 1", got)
	}

	if err := m.WaitRevision(ctx, after); err != nil {
		t.Fatal(err)
	}
	usRouter := routing.NewRouter(cli, m, us, routing.RouterConfig{Region: "us-east", Window: time.Hour})
	for _, tenant := range tenants {
		p, ok := m.Placement(tenant)
		if !ok || p.Region != "us-east" || p.Epoch != after || p.Placed != "eu-west" {
			t.Fatalf("%s = %+v, want served by us-east at epoch %d", tenant, p, after)
		}
	}
	rt, err := usRouter.Route(ctx, tenants[n/2])
	if err != nil || rt.ForwardTo != "" || !rt.Uncertain {
		t.Errorf("route of a moved tenant = %+v, %v; want served here, uncertain", rt, err)
	}
	if p, _ := m.Placement("us-0000003"); p.Region != "us-east" || p.Epoch >= after {
		t.Errorf("a us-east tenant = %+v; want unchanged", p)
	}
}

// TestMapLoadsInPages: a node whose etcd client accepts responses of at
// most 256 KiB still loads a keyspace several times that size.
func TestMapLoadsInPages(t *testing.T) {
	srv := etcdtest.Start(t)
	tenants := placeTenants(t, srv.Client(t), "tenant-with-a-rather-long-name", "eu-west", 10_000)
	cfg := srv.Config()
	cfg.MaxCallRecvMsgSize = 256 << 10
	m := newMap(t, etcdtest.NewClient(t, cfg))
	if got := len(m.Placements()); got != len(tenants) {
		t.Errorf("map holds %d placements, want %d", got, len(tenants))
	}
}

// TestNewTenantNeedsNoWrite: with a default region list set, two nodes of
// different regions agree on the home of tenants nobody placed, and routing
// them writes nothing; an explicit placement overrides the default.
func TestNewTenantNeedsNoWrite(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	regions := []string{"ap-south", "eu-west", "us-east"}
	val, _ := json.Marshal(map[string][]string{"regions": regions})
	if _, err := cli.Put(ctx, "/idem/placement/default-regions", string(val)); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*routing.Router{}
	for _, r := range regions {
		mem := join(t, cli, r, r+"-1")
		nodes[r] = routing.NewRouter(cli, newMap(t, cli), mem, routing.RouterConfig{Region: r, Window: time.Hour})
	}
	for _, rt := range nodes {
		waitFor(t, "maps to see every node", func() bool {
			for _, r := range regions {
				if len(rt.Map().Nodes(r)) == 0 {
					return false
				}
			}
			return true
		})
	}
	before := revision(t, cli)
	homes := map[string]int{}
	for i := range 300 {
		tenant := fmt.Sprintf("fresh-%d", i)
		eu, err1 := nodes["eu-west"].Route(ctx, tenant)
		us, err2 := nodes["us-east"].Route(ctx, tenant)
		if err1 != nil || err2 != nil || eu.Placement != us.Placement {
			t.Fatalf("%s: eu-west routes %+v (%v), us-east %+v (%v); want the same placement", tenant, eu, err1, us, err2)
		}
		home := eu.Placement.Region
		if (home == "eu-west") != (eu.ForwardTo == "") || (home == "us-east") != (us.ForwardTo == "") {
			t.Errorf("%s homed in %s: eu-west forwards to %q, us-east to %q", tenant, home, eu.ForwardTo, us.ForwardTo)
		}
		homes[home]++
	}
	if after := revision(t, cli); after != before {
		t.Errorf("routing new tenants wrote %d revisions, want none", after-before)
	}
	if len(homes) != len(regions) {
		t.Errorf("default homes %v; want every region used", homes)
	}

	home := nodes["eu-west"].Map()
	p0, _ := home.Placement("fresh-0")
	other := "eu-west"
	if p0.Region == other {
		other = "us-east"
	}
	set, err := routing.SetPlacement(ctx, cli, "fresh-0", other)
	if err != nil {
		t.Fatal(err)
	}
	if err := home.WaitRevision(ctx, set.Epoch); err != nil {
		t.Fatal(err)
	}
	if p, _ := home.Placement("fresh-0"); p.Region != other || p.Default || p.Epoch <= p0.Epoch {
		t.Errorf("after an explicit placement in %s: %+v (default was %+v)", other, p, p0)
	}
}

// TestDefaultRegionsAreSetOnce: the list is stored sorted; the same list
// again is accepted, another refused; DefaultHome ignores the list's order.
func TestDefaultRegionsAreSetOnce(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	got, err := routing.SetDefaultRegions(ctx, cli, []string{"us-east", "eu-west"})
	if err != nil || fmt.Sprint(got) != "[eu-west us-east]" {
		t.Fatalf("set = %v, %v", got, err)
	}
	if _, err := routing.SetDefaultRegions(ctx, cli, []string{"eu-west", "us-east"}); err != nil {
		t.Errorf("the same list again: %v", err)
	}
	if _, err := routing.SetDefaultRegions(ctx, cli, []string{"eu-west", "us-east", "ap-south"}); !errors.Is(err, routing.ErrDefaultRegionsSet) {
		t.Errorf("another list = %v, want ErrDefaultRegionsSet", err)
	}
	for i := range 100 {
		tenant := fmt.Sprint("t", i)
		if a, b := routing.DefaultHome(tenant, []string{"a", "b", "c"}), routing.DefaultHome(tenant, []string{"c", "a", "b"}); a != b {
			t.Fatalf("DefaultHome(%s) depends on the order: %s vs %s", tenant, a, b)
		}
	}
}

// TestStaleMapCannotServeAMovedTenant: a node of the failed region that
// comes back with a map that has not seen the failover (its watch stopped)
// does not serve the moved tenant: its registration is newer than its map,
// so it refuses until the map catches up; with a current map it forwards.
func TestStaleMapCannotServeAMovedTenant(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	placeTenants(t, cli, "eu", "eu-west", 100)
	eu := join(t, cli, "eu-west", "eu-1")
	join(t, cli, "us-east", "us-1")
	stale := newMap(t, cli)
	stale.Close() // frozen: it will never see the failover
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mv, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	back := join(t, cli, "eu-west", "eu-1")
	if back.ServingFrom() <= mv.Epoch {
		t.Fatalf("registration %d not after the failover %d", back.ServingFrom(), mv.Epoch)
	}
	if p, _ := stale.Placement("eu-0000007"); p.Region != "eu-west" {
		t.Fatalf("the stale map already knows: %+v", p)
	}
	staleRouter := routing.NewRouter(cli, stale, back, routing.RouterConfig{Region: "eu-west"})
	rt, err := staleRouter.Route(ctx, "eu-0000007")
	if idem.ErrorCode(err) != idem.ECodeNotHome {
		t.Errorf("stale node routed a moved tenant: %+v, %v; want %s", rt, err, idem.ECodeNotHome)
	}
	if err := staleRouter.Ready(); idem.ErrorCode(err) != idem.ECodeNotHome {
		t.Errorf("stale node Ready() = %v; want %s", err, idem.ECodeNotHome)
	}
	current := newMap(t, cli)
	currentRouter := routing.NewRouter(cli, current, back, routing.RouterConfig{Region: "eu-west"})
	rt, err = currentRouter.Route(ctx, "eu-0000007")
	if err != nil || rt.ForwardTo != "http://us-1.invalid" || rt.Placement.Epoch != mv.Epoch {
		t.Errorf("current node = %+v, %v; want forward to us-1 at epoch %d", rt, err, mv.Epoch)
	}
	if err := current.WaitRevision(ctx, back.ServingFrom()); err != nil {
		t.Fatal(err)
	}
	if err := currentRouter.Ready(); err != nil {
		t.Errorf("current node Ready() = %v; want ready", err)
	}
	// A node whose region has lost its lease is not ready, whatever its map.
	if err := back.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := currentRouter.Ready(); idem.ErrorCode(err) != idem.ECodeNotHome {
		t.Errorf("node without its lease: Ready() = %v; want %s", err, idem.ECodeNotHome)
	}
}

// TestMovesAfterARegionFailover: a planned move of one tenant after a region
// failover overrides it; another region's failure chains; a live serving
// region is never skipped; fail-back returns the region's tenants with a
// new epoch and a failover record from the region that served them.
func TestMovesAfterARegionFailover(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	placeTenants(t, cli, "eu", "eu-west", 3)
	eu := join(t, cli, "eu-west", "eu-1")
	us := join(t, cli, "us-east", "us-1")
	join(t, cli, "ap-south", "ap-1")
	m := newMap(t, cli)
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	planned, err := routing.MoveTenant(ctx, cli, "eu-0000000", "ap-south", time.Now())
	if err != nil || planned.Region != "ap-south" || planned.Epoch <= first.Epoch {
		t.Fatalf("planned move after the failover = %+v, %v", planned, err)
	}
	if err := m.WaitRevision(ctx, planned.Epoch); err != nil {
		t.Fatal(err)
	}
	if f, ok := m.Failover("eu-0000000"); !ok || f.From != "us-east" || f.To != "ap-south" || f.Region != "" {
		t.Errorf("planned move's failover = %+v %v; want us-east -> ap-south", f, ok)
	}
	if p, _ := m.Placement("eu-0000001"); p.Region != "us-east" || p.Epoch != first.Epoch {
		t.Errorf("eu-0000001 = %+v", p)
	}
	// us-east is alive and serves eu-west's tenants: eu-west cannot be moved
	// elsewhere under it.
	if _, err := routing.MoveRegion(ctx, cli, "eu-west", "ap-south", time.Now()); !errors.Is(err, routing.ErrRegionAlive) {
		t.Errorf("moving eu-west away from a live us-east = %v, want ErrRegionAlive", err)
	}
	// us-east fails too: its tenants, eu-west's included, chain to ap-south.
	if err := us.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := routing.MoveRegion(ctx, cli, "us-east", "ap-south", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitRevision(ctx, second.Epoch); err != nil {
		t.Fatal(err)
	}
	if p, _ := m.Placement("eu-0000001"); p.Region != "ap-south" || p.Epoch != second.Epoch {
		t.Errorf("eu-0000001 after us-east failed = %+v", p)
	}
	if p, _ := m.Placement("eu-0000000"); p.Region != "ap-south" || p.Epoch != planned.Epoch {
		t.Errorf("eu-0000000 (planned to ap-south) = %+v", p)
	}
	if got := fmt.Sprint(m.HomeRegions()); got != "[ap-south]" {
		t.Errorf("home regions = %s", got)
	}
	// us-east returns and takes its own tenants back; eu-west's stay with
	// ap-south (their region's move is older than us-east's... and chains
	// through us-east, which now serves itself again).
	join(t, cli, "us-east", "us-2")
	back, err := routing.FailBack(ctx, cli, "us-east", time.Now())
	if err != nil || back.From != "ap-south" || back.ServedBy != "us-east" {
		t.Fatalf("fail back = %+v, %v", back, err)
	}
	if _, err := routing.FailBack(ctx, cli, "us-east", time.Now()); err == nil {
		t.Error("a second fail-back succeeded")
	}
	if err := m.WaitRevision(ctx, back.Epoch); err != nil {
		t.Fatal(err)
	}
	p, _ := m.Placement("eu-0000001")
	f, _ := m.Failover("eu-0000001")
	if p.Region != "us-east" || p.Epoch != back.Epoch || f.From != "ap-south" || f.To != "us-east" || f.HandedOver {
		t.Errorf("eu-0000001 after us-east's fail-back = %+v, failover %+v", p, f)
	}
	// eu-west returns and takes its own back; a region handover mark ends
	// their uncertainty in one write.
	join(t, cli, "eu-west", "eu-2")
	home, err := routing.FailBack(ctx, cli, "eu-west", time.Now())
	if err != nil || home.From != "us-east" {
		t.Fatalf("fail back eu-west = %+v, %v", home, err)
	}
	if err := routing.MarkRegionHandedOver(ctx, cli, home); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the handover mark", func() bool { f, _ := m.Failover("eu-0000002"); return f.HandedOver })
	if p, _ := m.Placement("eu-0000002"); p.Region != "eu-west" || p.Epoch != home.Epoch {
		t.Errorf("eu-0000002 after eu-west's fail-back = %+v", p)
	}
	if p, _ := m.Placement("eu-0000000"); p.Region != "ap-south" {
		t.Errorf("the planned move did not survive the fail-backs: %+v", p)
	}
}

// TestRepeatedFailoverOfARegion: a tenant moved back to a failed-over
// region by a planned move is covered by that region's next failover, whose
// record says it came from that region.
func TestRepeatedFailoverOfARegion(t *testing.T) {
	ctx := ctxFor(t)
	cli := etcdtest.Start(t).Client(t)
	placeTenants(t, cli, "eu", "eu-west", 2)
	join(t, cli, "us-east", "us-1")
	if _, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now()); err != nil {
		t.Fatal(err)
	}
	eu := join(t, cli, "eu-west", "eu-2")
	if _, err := routing.MoveTenant(ctx, cli, "eu-0000000", "eu-west", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now()); !errors.Is(err, routing.ErrRegionAlive) {
		t.Fatalf("failover of a live region = %v", err)
	}
	if err := eu.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now())
	if err != nil || again.From != "eu-west" {
		t.Fatalf("second failover = %+v, %v; want from eu-west", again, err)
	}
	for _, tenant := range []string{"eu-0000000", "eu-0000001"} {
		if p, _, _ := routing.GetPlacement(ctx, cli, tenant); p.Region != "us-east" || p.Epoch != again.Epoch {
			t.Errorf("%s = %+v", tenant, p)
		}
	}
}

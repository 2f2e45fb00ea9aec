package routing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/routing"
)

// BenchmarkRegionFailover measures a region failover (eu-west -> us-east)
// against the number of tenants eu-west homes: from the failover command
// until every node (Map) of us-east has applied it, the etcd revisions
// (write transactions) it took, the bytes it wrote (keys and values) and the
// watch events each node received. move=region is MoveRegion (one key);
// move=per-tenant is the previous design (one transaction per tenant after
// an unpaginated read of every placement), kept here for comparison.
// link=wan puts 30 ms each way between every client and etcd (toxiproxy);
// link=quorum runs three etcd members, one per region, with 30 ms each way
// on every peer link, the operator and us-east's nodes next to us-east's
// member.
//
//	go test ./routing -run '^$' -bench RegionFailover -benchtime 1x
func BenchmarkRegionFailover(b *testing.B) {
	type run struct {
		link    string
		tenants int
		move    string
	}
	var runs []run
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		runs = append(runs, run{"loopback", n, "region"})
		if n <= 10_000 {
			runs = append(runs, run{"loopback", n, "per-tenant"})
		}
	}
	for _, link := range []string{"wan", "quorum"} {
		for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
			if link == "wan" && n > 100_000 {
				continue // the quorum runs cover 10^6 across the WAN
			}
			runs = append(runs, run{link, n, "region"})
			if n <= 1_000 {
				runs = append(runs, run{link, n, "per-tenant"})
			}
		}
	}
	for _, r := range runs {
		b.Run(fmt.Sprintf("link=%s/tenants=%d/move=%s", r.link, r.tenants, r.move), func(b *testing.B) {
			benchFailover(b, r.link, r.tenants, r.move == "per-tenant")
		})
	}
}

func benchFailover(b *testing.B, link string, n int, perTenant bool) {
	ctx := context.Background()
	var local *clientv3.Client // the loader and the watch that counts
	var cfg clientv3.Config    // the operator's and us-east's nodes'
	switch link {
	case "quorum":
		// eu-west's member, us-east's member, 30 ms each way between them.
		q := startWANQuorum(b, 30*time.Millisecond)
		local, cfg = etcdtest.NewClient(b, q.config(0)), q.config(1)
	default:
		srv := etcdtest.Start(b)
		local, cfg = srv.Client(b), srv.Config()
		if link == "wan" {
			cfg.Endpoints = []string{wanProxy(b, srv.Endpoints[0])}
		}
	}
	operator := etcdtest.NewClient(b, cfg)
	tenants := placeTenants(b, local, "eu", "eu-west", n)
	eu, err := routing.Join(ctx, local, "eu-west", "eu-1", "http://eu-1.invalid", 2*time.Second, nil)
	if err != nil {
		b.Fatal(err)
	}
	var maps []*routing.Map
	for i := range 3 { // us-east's nodes, each with its own client and map
		m, err := routing.NewMap(ctx, etcdtest.NewClient(b, cfg), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(m.Close)
		mem, err := routing.Join(ctx, local, "us-east", fmt.Sprint("us-", i), "http://us.invalid", 2*time.Second, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = mem.Close(context.Background()) })
		maps = append(maps, m)
	}
	if err := eu.Close(ctx); err != nil {
		b.Fatal(err)
	}
	var elapsed time.Duration
	var revs, bytes, events int64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		if i > 0 {
			restore(b, local, tenants, maps)
		}
		before := headRevision(b, local)
		watch := local.Watch(ctx, "/idem/", clientv3.WithPrefix(), clientv3.WithRev(before+1))
		b.StartTimer()
		start := time.Now()
		if perTenant {
			err = perTenantMoveRegion(ctx, operator, "eu-west", "us-east", time.Now())
		} else {
			_, err = routing.MoveRegion(ctx, operator, "eu-west", "us-east", time.Now())
		}
		if err != nil {
			b.Fatal(err)
		}
		after := headRevision(b, operator)
		for _, m := range maps {
			if err := m.WaitRevision(ctx, after); err != nil {
				b.Fatal(err)
			}
		}
		elapsed += time.Since(start)
		b.StopTimer()
		revs += after - before
		for resp := range watch {
			for _, ev := range resp.Events {
				events++
				bytes += int64(len(ev.Kv.Key) + len(ev.Kv.Value))
			}
			if resp.Header.Revision >= after {
				break
			}
		}
		for _, m := range maps {
			for _, t := range tenants {
				if p, _ := m.Placement(t); p.Region != "us-east" {
					b.Fatalf("%s = %+v after the failover", t, p)
				}
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	per := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(elapsed.Seconds()/per, "s/failover")
	b.ReportMetric(float64(revs)/per, "txns/failover")
	b.ReportMetric(float64(bytes)/per, "bytes-written/failover")
	b.ReportMetric(float64(events)/per, "watch-events/node")
}

// restore puts every tenant back in eu-west (untimed), as before a failover.
func restore(b *testing.B, cli *clientv3.Client, tenants []string, maps []*routing.Map) {
	ctx := context.Background()
	if _, err := cli.Delete(ctx, routing.RegionPlacementPrefix, clientv3.WithPrefix()); err != nil {
		b.Fatal(err)
	}
	if _, err := cli.Delete(ctx, routing.FailoverPrefix, clientv3.WithPrefix()); err != nil {
		b.Fatal(err)
	}
	placeTenants(b, cli, "eu", "eu-west", len(tenants))
	rev := headRevision(b, cli)
	for _, m := range maps {
		if err := m.WaitRevision(ctx, rev); err != nil {
			b.Fatal(err)
		}
	}
}

func headRevision(tb testing.TB, cli *clientv3.Client) int64 {
	resp, err := cli.Get(context.Background(), "/idem/never-written")
	if err != nil {
		tb.Fatal(err)
	}
	return resp.Header.Revision
}

// wanProxy starts a toxiproxy in front of etcd adding 30 ms each way.
func wanProxy(tb testing.TB, upstream string) string {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "wan->etcd", "127.0.0.1:0", strings.TrimPrefix(upstream, "http://"))
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"wan-%s","type":"latency","stream":%q,"attributes":{"latency":30}}`, stream, stream)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			tb.Fatal(err)
		}
	}
	// Before the proxy stops (cleanups run last first): a latency toxic
	// still holding data would otherwise outlive it.
	tb.Cleanup(func() { p.Toxics.ResetToxics(context.Background()) })
	return "http://" + p.Listen
}

// perTenantMoveRegion is the previous MoveRegion: one unpaginated read of
// every placement, then one conditional transaction per tenant writing its
// placement and its failover record.
func perTenantMoveRegion(ctx context.Context, cli *clientv3.Client, from, to string, now time.Time) error {
	resp, err := cli.Get(ctx, routing.PlacementPrefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	val, _ := json.Marshal(map[string]string{"region": to})
	for _, kv := range resp.Kvs {
		var p struct{ Region string }
		if json.Unmarshal(kv.Value, &p) != nil || p.Region != from {
			continue
		}
		tenant := string(kv.Key[len(routing.PlacementPrefix):])
		fv, _ := json.Marshal(routing.Failover{Tenant: tenant, From: from, To: to, At: now.UTC()})
		r, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision),
			clientv3.Compare(clientv3.CreateRevision(routing.RegionNodesPrefix(from)), "=", 0).WithPrefix(),
		).Then(clientv3.OpPut(string(kv.Key), string(val)), clientv3.OpPut(routing.FailoverPrefix+tenant, string(fv))).Commit()
		if err != nil {
			return err
		}
		if !r.Succeeded {
			return routing.ErrEpochChanged
		}
	}
	return nil
}

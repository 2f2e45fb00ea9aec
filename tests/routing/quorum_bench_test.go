package routing_test

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// wanQuorum is a three-member etcd cluster, one member per region, whose
// peer links each carry oneWay latency in both directions (a toxiproxy in
// front of every member's peer listener), so every write waits for a quorum
// across the WAN as in a real three-region deployment. Clients reach the
// members directly: an operator and a region's nodes sit next to their
// region's member.
type wanQuorum struct {
	// endpoints[i] is member i's client URL (http://127.0.0.1:PORT).
	endpoints []string
}

// startWANQuorum starts the cluster and stops it in b.Cleanup.
func startWANQuorum(b *testing.B, oneWay time.Duration) *wanQuorum {
	b.Helper()
	const members = 3
	tox := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	var (
		peers   = make([]string, members) // the real peer listeners
		proxies = make([]*toxiproxy.Proxy, members)
		initial []string
	)
	for i := range members {
		peers[i] = freeAddr(b)
		p := toxiproxy.NewProxy(tox, fmt.Sprint("peer-", i), "127.0.0.1:0", peers[i])
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Stop)
		for _, stream := range []string{"upstream", "downstream"} {
			toxic := fmt.Sprintf(`{"name":"wan-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, oneWay.Milliseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				b.Fatal(err)
			}
		}
		proxies[i] = p
		initial = append(initial, fmt.Sprintf("m%d=http://%s", i, p.Listen))
	}
	q := &wanQuorum{endpoints: make([]string, members)}
	etcds := make([]*embed.Etcd, members)
	var wg sync.WaitGroup
	errs := make([]error, members)
	for i := range members {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprint("m", i)
		cfg.Dir = b.TempDir()
		loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{loopback}, []url.URL{loopback}
		cfg.ListenPeerUrls = []url.URL{{Scheme: "http", Host: peers[i]}}
		cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: proxies[i].Listen}}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "wan-quorum"
		cfg.UnsafeNoFsync = true
		// Ticks sized for a 2*oneWay round trip (etcd's tuning guide:
		// heartbeat about the RTT, election timeout ten times it).
		cfg.TickMs = uint(max(100, 2*oneWay.Milliseconds()))
		cfg.ElectionMs = 10 * cfg.TickMs
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		wg.Go(func() {
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				errs[i] = err
				return
			}
			etcds[i] = e
			select {
			case <-e.Server.ReadyNotify():
				q.endpoints[i] = "http://" + e.Clients[0].Addr().String()
			case <-time.After(time.Minute):
				errs[i] = fmt.Errorf("member %d not ready after a minute", i)
			}
		})
	}
	wg.Wait()
	b.Cleanup(func() {
		for _, p := range proxies {
			p.Toxics.ResetToxics(b.Context())
		}
		for _, e := range etcds {
			if e != nil {
				e.Close()
			}
		}
	})
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return q
}

// config is a client configuration for member i alone.
func (q *wanQuorum) config(i int) clientv3.Config {
	return clientv3.Config{Endpoints: []string{q.endpoints[i]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
}

// freeAddr returns a 127.0.0.1 address with a port free at the time of the
// call (a member's peer listener must be known before it starts: the other
// members' initial cluster names it through its proxy).
func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

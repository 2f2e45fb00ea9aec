package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// Operation names of the forward suite.
const (
	OpServedAtHome = "served at home"
	OpForwarded    = "forwarded across the WAN"
)

// forwardOneWay is the WAN latency the forward suite injects in each
// direction between the two regions.
const forwardOneWay = 40 * time.Millisecond

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// mergedListener accepts from several listeners; the home node serves its
// clients on one and the WAN link's connections on another, so the suite
// can count the connections forwarding opened.
type mergedListener struct {
	lns   []net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func mergeListeners(lns ...net.Listener) *mergedListener {
	m := &mergedListener{lns: lns, conns: make(chan net.Conn), done: make(chan struct{})}
	for _, ln := range lns {
		m.wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				select {
				case m.conns <- c:
				case <-m.done:
					_ = c.Close()
					return
				}
			}
		})
	}
	return m
}

func (m *mergedListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *mergedListener) Close() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		for _, ln := range m.lns {
			err = errors.Join(err, ln.Close())
		}
		m.wg.Wait()
	})
	return err
}

func (m *mergedListener) Addr() net.Addr { return m.lns[0].Addr() }

// startEtcd starts a single-member embedded etcd in dir on loopback ports
// and returns a client and a stop function.
func startEtcd(dir string) (*clientv3.Client, func(), error) {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "bench", dir
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{loopback}, []url.URL{loopback}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{loopback}, []url.URL{loopback}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		e.Close()
		return nil, nil, errors.New("etcd not ready after a minute")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + e.Clients[0].Addr().String()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		e.Close()
		return nil, nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, func() { _ = cli.Close(); e.Close() }, nil
}

// wanLink starts a toxiproxy to upstream with oneWay latency each way.
func wanLink(upstream string, oneWay time.Duration) (*toxiproxy.Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "wan", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("wan proxy: %w", err)
	}
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"wan-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, oneWay.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			p.Stop()
			return nil, fmt.Errorf("wan proxy: %w", err)
		}
	}
	return p, nil
}

// benchNode is a node of the forward suite's two-region cluster.
type benchNode struct {
	srv  *region.Server
	m    *routing.Map
	mem  *routing.Membership
	stop func(context.Context)
}

// startRegionNode starts a node of region on ln, registered in etcd under
// advertised (the URL other regions reach it by).
func startRegionNode(ctx context.Context, cli *clientv3.Client, st *store.Store, ln net.Listener, regionName, advertised, tenant string, secret []byte) (*benchNode, error) {
	m, err := routing.NewMap(ctx, cli, nil)
	if err != nil {
		return nil, err
	}
	mem, err := routing.Join(ctx, cli, regionName, regionName+"-0", advertised, 5*time.Second, nil)
	if err != nil {
		m.Close()
		return nil, err
	}
	srv, err := region.NewServer(region.Config{Listener: ln, Region: regionName, NodeID: regionName + "-0",
		Tokens: map[string]string{benchToken: tenant}, PeerSecret: secret,
		Router: routing.NewRouter(cli, m, mem, routing.RouterConfig{Region: regionName, Window: time.Hour})},
		st, paymentsnode.Operation(payments.NewService(st, payments.Config{Region: regionName}), paymentsnode.Outbox{}))
	if err == nil {
		err = srv.Open()
	}
	if err != nil {
		_ = mem.Close(ctx)
		m.Close()
		return nil, err
	}
	return &benchNode{srv: srv, m: m, mem: mem, stop: func(ctx context.Context) {
		_ = srv.Close(ctx)
		_ = mem.Close(ctx)
		m.Close()
	}}, nil
}

// runForward measures POST /payments of a tenant homed in eu-west sent to
// us-east's node, which forwards it across a WAN link (40 ms each way,
// toxiproxy) to eu-west's node, against the same request sent to eu-west's
// node directly. It reports the connections forwarding opened across the
// link (ForwardDials): pooled connections keep it near the concurrency,
// whatever the number of requests.
func runForward(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteForward, cfg)
	dir, err := os.MkdirTemp("", "idem-bench-etcd-")
	if err != nil {
		return SuiteReport{}, fmt.Errorf("etcd dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cli, stopEtcd, err := startEtcd(dir)
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopEtcd()
	if _, err := routing.SetPlacement(ctx, cli, w.tenant, "eu-west"); err != nil {
		return SuiteReport{}, err
	}
	secret := []byte(runID() + runID() + runID() + runID())

	// eu-west: one listener for its clients, one behind the WAN link.
	direct, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return SuiteReport{}, err
	}
	wanSide, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = direct.Close()
		return SuiteReport{}, err
	}
	counted := &countingListener{Listener: wanSide}
	link, err := wanLink(wanSide.Addr().String(), forwardOneWay)
	if err != nil {
		_ = direct.Close()
		_ = wanSide.Close()
		return SuiteReport{}, err
	}
	defer link.Stop()
	defer link.Toxics.ResetToxics(context.WithoutCancel(ctx))
	home, err := startRegionNode(ctx, cli, st, mergeListeners(direct, counted), "eu-west", "http://"+link.Listen, w.tenant, secret)
	if err != nil {
		_ = direct.Close()
		_ = wanSide.Close()
		return SuiteReport{}, err
	}
	defer home.stop(context.WithoutCancel(ctx))
	edgeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return SuiteReport{}, err
	}
	edge, err := startRegionNode(ctx, cli, st, edgeLn, "us-east", "http://"+edgeLn.Addr().String(), w.tenant, secret)
	if err != nil {
		_ = edgeLn.Close()
		return SuiteReport{}, err
	}
	defer edge.stop(context.WithoutCancel(ctx))
	for _, n := range []*benchNode{home, edge} {
		if err := n.m.WaitRevision(ctx, max(home.mem.ServingFrom(), edge.mem.ServingFrom())); err != nil {
			return SuiteReport{}, err
		}
	}

	tr := benchTransport(cfg)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	results, err := alternate(ctx, cfg, SuiteForward, []op{
		{OpServedAtHome, poster(client, "http://"+direct.Addr().String(), w, "h")},
		{OpForwarded, poster(client, edge.srv.URL(), w, "f")},
	})
	if err != nil {
		return SuiteReport{}, err
	}
	rep := SuiteReport{Suite: SuiteForward, Concurrency: cfg.Concurrency, Results: results,
		Ratios:       []Ratio{ratio(results, OpForwarded, OpServedAtHome)},
		ForwardDials: int(counted.accepted.Load()), RTTMs: float64(2 * forwardOneWay.Milliseconds())}
	rep.Payments, rep.Records, err = countRows(ctx, st, w.tenant)
	return rep, err
}

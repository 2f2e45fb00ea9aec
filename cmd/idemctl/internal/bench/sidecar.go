package bench

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

// Operation names of the sidecar suite.
const (
	OpUpstreamDirect = "upstream direct"
	// OpPlainProxy is the same request through the standard library's
	// httputil.ReverseProxy, a hop with no idempotency layer: the sidecar's
	// cost beyond the hop is its ratio to this.
	OpPlainProxy = "through a plain reverse proxy"
	// OpProxyTwoCommits is OpPlainProxy with a durable write transaction
	// before the call and one after it, each of nothing but its commit:
	// the sidecar's floor, the hop and the two commits it must make (the
	// claim before the call, the answer after it) without the record.
	OpProxyTwoCommits = "plain proxy and two commits"
	OpSidecar         = "through the sidecar"
	// OpSidecarNoGroupCommit is OpSidecar over Config.NoGroupCommit.
	OpSidecarNoGroupCommit = "sidecar, no group commit"
	// OpSidecarSharedPool is the sidecar's route on a node whose store is
	// the upstream's (one pool for both), beside the sidecar on a store of
	// its own (Config.Sidecar).
	OpSidecarSharedPool = "sidecar on the upstream's pool"
)

// upstreamHandler is the service a sidecar fronts, written as a good
// service would be without the layer: it trusts its caller (the sidecar or
// a client on a private network), reads the bounded body, does the business
// write (payment row and outbox event, one SERIALIZABLE transaction) and
// renders the v2 payment.
type upstreamHandler struct {
	st     *store.Store
	tenant string
	run    string
	seq    atomic.Int64
}

func (h *upstreamHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/transfers" {
		http.Error(w, `{"errorCode":"NOT_FOUND"}`, http.StatusNotFound)
		return
	}
	writePayment(w, r, h.st, h.tenant, fmt.Sprintf("pay_up_%s_%d", h.run, h.seq.Add(1)))
}

// serve serves h on a fresh loopback listener until the returned stop is
// called.
func serve(h http.Handler) (string, func(context.Context), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: region.DefaultReadHeaderTimeout, WriteTimeout: region.DefaultWriteTimeout,
		IdleTimeout: region.DefaultIdleTimeout}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func(ctx context.Context) {
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// benchTransport is the clients' pooled transport.
func benchTransport(cfg Config) *http.Transport {
	return &http.Transport{MaxIdleConns: 4 * cfg.Concurrency, MaxIdleConnsPerHost: 2 * cfg.Concurrency, IdleConnTimeout: time.Minute}
}

// runSidecar measures POST /transfers through a node's sidecar route
// (claim, proxy, store the answer) against the same request sent to the
// upstream directly.
func runSidecar(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteSidecar, cfg)
	upURL, stopUp, err := serve(&upstreamHandler{st: st, tenant: w.tenant, run: w.run})
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopUp(context.WithoutCancel(ctx))
	// As idemd --proxy-routes would, with the parser's defaults.
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + upURL)
	if err != nil {
		return SuiteReport{}, err
	}
	// The node and the floor's commits write through a pool of their own
	// (Config.Sidecar), the upstream through the suite's store.
	own := st
	if cfg.Sidecar != nil {
		own = cfg.Sidecar
	}
	node, stopNode, err := sidecarNode(ctx, own, w, routes)
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopNode()
	proxyURL, stopProxy, err := plainProxy(upURL, cfg)
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopProxy(context.WithoutCancel(ctx))
	floorURL, stopFloor, err := proxyWithCommits(own, upURL, cfg)
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopFloor(context.WithoutCancel(ctx))
	tr := benchTransport(cfg)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ops := []op{
		{OpUpstreamDirect, post(client, upURL+"/transfers", "", w, "d")},
		{OpPlainProxy, post(client, proxyURL+"/transfers", "", w, "p")},
		{OpProxyTwoCommits, post(client, floorURL+"/transfers", "", w, "f")},
		{OpSidecar, post(client, node.URL()+"/transfers", benchToken, w, "s")},
	}
	if cfg.NoGroupCommit != nil {
		plain, stopPlain, err := sidecarNode(ctx, cfg.NoGroupCommit, w, routes)
		if err != nil {
			return SuiteReport{}, err
		}
		defer stopPlain()
		ops = append(ops, op{OpSidecarNoGroupCommit, post(client, plain.URL()+"/transfers", benchToken, w, "n")})
	}
	if cfg.Sidecar != nil {
		shared, stopShared, err := sidecarNode(ctx, st, w, routes)
		if err != nil {
			return SuiteReport{}, err
		}
		defer stopShared()
		ops = append(ops, op{OpSidecarSharedPool, post(client, shared.URL()+"/transfers", benchToken, w, "u")})
	}
	results, err := alternate(ctx, cfg, SuiteSidecar, ops)
	if err != nil {
		return SuiteReport{}, err
	}
	rep := SuiteReport{Suite: SuiteSidecar, Concurrency: cfg.Concurrency, Results: results,
		Ratios: []Ratio{ratio(results, OpSidecar, OpUpstreamDirect), ratio(results, OpPlainProxy, OpUpstreamDirect),
			ratio(results, OpSidecar, OpPlainProxy), ratio(results, OpProxyTwoCommits, OpPlainProxy),
			ratio(results, OpSidecar, OpProxyTwoCommits)}}
	if cfg.NoGroupCommit != nil {
		rep.Ratios = append(rep.Ratios, ratio(results, OpSidecar, OpSidecarNoGroupCommit))
	}
	if cfg.Sidecar != nil {
		rep.Ratios = append(rep.Ratios, ratio(results, OpSidecar, OpSidecarSharedPool))
	}
	rep.Payments, rep.Records, err = countRows(ctx, st, w.tenant)
	return rep, err
}

// plainProxy serves the standard library's reverse proxy in front of
// upURL, with the same server timeouts as the upstream and a pooled
// transport as large as the clients': the hop alone, for the sidecar's
// cost to be told from it.
func plainProxy(upURL string, cfg Config) (string, func(context.Context), error) {
	rp, tr, err := reverseProxy(upURL, cfg)
	if err != nil {
		return "", nil, err
	}
	u, stop, err := serve(rp)
	if err != nil {
		return "", nil, err
	}
	return u, func(ctx context.Context) { stop(ctx); tr.CloseIdleConnections() }, nil
}

// reverseProxy is the standard library's reverse proxy to upURL over a
// pooled transport as large as the clients'.
func reverseProxy(upURL string, cfg Config) (*httputil.ReverseProxy, *http.Transport, error) {
	target, err := url.Parse(upURL)
	if err != nil {
		return nil, nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	tr := benchTransport(cfg)
	rp.Transport = tr
	return rp, tr, nil
}

// proxyWithCommits is plainProxy with a write transaction of nothing
// but its commit (an xid assigned, a commit record flushed) before the
// call and another after it, each sent as the store sends a claim or a
// completion (store.Store.ExecOne).
func proxyWithCommits(st *store.Store, upURL string, cfg Config) (string, func(context.Context), error) {
	rp, tr, err := reverseProxy(upURL, cfg)
	if err != nil {
		return "", nil, err
	}
	commit := func(ctx context.Context) error {
		return st.ExecOne(ctx, func(q store.Querier) error {
			_, err := q.Exec(ctx, `SELECT pg_current_xact_id()`)
			return err
		})
	}
	u, stop, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := commit(r.Context()); err != nil {
			http.Error(w, "commit before", http.StatusServiceUnavailable)
			return
		}
		// The answer is kept until the second commit, as the sidecar
		// keeps it until its record holds it.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		if err := commit(r.Context()); err != nil {
			http.Error(w, "commit after", http.StatusServiceUnavailable)
			return
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	if err != nil {
		return "", nil, err
	}
	return u, func(ctx context.Context) { stop(ctx); tr.CloseIdleConnections() }, nil
}

// sidecarNode starts a node over st whose sidecar fronts routes, as idemd
// --proxy-routes would; stop closes it.
func sidecarNode(ctx context.Context, st *store.Store, w *writer, routes []sidecar.Route) (*region.Server, func(), error) {
	node, err := region.NewServer(region.Config{Addr: "127.0.0.1:0", Region: "bench", Tokens: map[string]string{benchToken: w.tenant},
		Sidecar: region.SidecarConfig{Routes: routes}},
		st, paymentsnode.Operation(payments.NewService(st, payments.Config{Region: "bench"}), paymentsnode.Outbox{}))
	if err != nil {
		return nil, nil, err
	}
	if err := node.Open(); err != nil {
		return nil, nil, err
	}
	return node, func() { _ = node.Close(context.WithoutCancel(ctx)) }, nil
}

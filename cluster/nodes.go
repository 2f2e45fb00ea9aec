package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/routing"
)

// newNode makes (without starting it) node i of region rs.
func (c *Cluster) newNode(cfg *Config, rs *regionState, i int, env []string) (*Process, error) {
	name := fmt.Sprintf("%s-%d", rs.name, i)
	dbURL := rs.dbURL
	// The replicated store's multi-host URL is used as it is: the nodes
	// reach its members directly, and its own links are proxied instead.
	if c.proxiesAll() && !isMultiHost(dbURL) {
		var err error
		if dbURL, err = c.proxyDatabase(name, dbURL); err != nil {
			return nil, err
		}
	}
	// The database URL may hold a password: it goes in the environment.
	env = append(slices.Clone(env), "IDEM_DATABASE_URL="+dbURL)
	if c.effectsURL != "" {
		effects := c.effectsURL
		if c.proxiesAll() && !isMultiHost(effects) {
			var err error
			if effects, err = c.proxyDatabaseAs(name, EndpointEffects, effects); err != nil {
				return nil, err
			}
		}
		env = append(env, "IDEM_EFFECTS_DATABASE_URL="+effects)
	}
	args := []string{
		"--region", rs.name,
		"--auth-tokens-file", c.secrets.tokens,
		"--admin-tokens-file", c.secrets.adminTokens,
		"--node-id", name,
		"--store-mode", cfg.StoreMode,
	}
	if c.tls != nil {
		cert, key, err := c.tls.issue(name, &routing.Peer{Region: rs.name, Node: name})
		if err != nil {
			return nil, err
		}
		ca := c.tls.ca.CertFile
		args = append(args, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca,
			"--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", key, "--provider-ca", ca)
	} else {
		args = append(args, "--peer-secret-file", c.peerSecret)
	}
	if cfg.ReplayWindow > 0 {
		args = append(args, "--replay-window", cfg.ReplayWindow.String())
	}
	if cfg.ProxyRoutes != "" {
		args = append(args, "--proxy-routes", cfg.ProxyRoutes)
	}
	if len(cfg.Operations) > 0 {
		args = append(args, "--operations", strings.Join(cfg.Operations, ","))
	}
	if etcd := c.EtcdMembers(); len(etcd) > 0 {
		var endpoints []string
		for _, m := range etcd {
			ep := m.URL()
			if c.proxiesAll() {
				l, err := c.net.set(name, m.Name(), m.Addr())
				if err != nil {
					return nil, err
				}
				ep = c.scheme() + "://" + l.Listen
			}
			endpoints = append(endpoints, ep)
		}
		args = append(args, "--etcd-endpoints", strings.Join(endpoints, ","),
			"--region-lease-ttl", cfg.RegionLeaseTTL.String())
	}
	if c.provider != nil {
		u := c.provider.URL()
		if c.proxiesAll() {
			l, err := c.net.set(name, EndpointProvider, c.provider.Addr())
			if err != nil {
				return nil, err
			}
			u = c.scheme() + "://" + l.Listen
		}
		args = append(args, "--provider-url", u, "--provider-api-key-file", c.secrets.providerAPIKey)
	}
	p := &Process{
		kind:         KindNode,
		name:         name,
		region:       rs.name,
		index:        i,
		path:         cfg.IdemdPath,
		env:          env,
		readyPath:    "/readyz",
		logPath:      filepath.Join(c.stateDir, "logs", name+".log"),
		readyTimeout: cfg.ReadyTimeout,
		stopGrace:    cfg.StopGrace,
		log:          c.log,
		scheme:       c.scheme(),
		tlsConfig:    c.ClientTLS(),
	}
	args = append(args, cfg.ExtraNodeArgs...)
	p.argv = func(addr string) []string { return append([]string{"--listen", addr}, args...) }
	advertise := func(listen string) string { return listen }
	if c.docker != nil {
		p.ctr = c.docker.newContainer(name, rs.name, c.docker.image)
		p.addr = fmt.Sprintf("%s:%d", p.ctr.nets[0].ip, dockerNodePort)
		advertise = viaWAN
	}
	if c.proxiesAll() {
		// Forwarded requests reach the node through its ingress link, made
		// once the node's port is known.
		ingress := "->" + name
		p.onAddr = func(addr string) error {
			_, err := c.net.set("", name, addr)
			return err
		}
		p.argv = func(addr string) []string {
			// Before ExtraNodeArgs, which may override it.
			return slices.Concat([]string{"--listen", addr, "--advertise-url", c.scheme() + "://" + advertise(c.net.listen(ingress))}, args)
		}
	}
	return p, nil
}

// nodeEnv is this process's environment without IDEM_* variables, plus
// extra.
func nodeEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// startNodes starts the first node of each database (concurrently), which
// applies the migrations, then every other node concurrently, and returns
// once all are ready. Concurrent first-time migrations of one database can
// fail in PostgreSQL's catalog ("type ... already exists").
func (c *Cluster) startNodes(ctx context.Context) error {
	var first, rest []*Process
	seen := map[string]bool{}
	for _, rs := range c.regions {
		for _, p := range rs.nodes {
			if seen[rs.dbURL] {
				rest = append(rest, p)
			} else {
				seen[rs.dbURL] = true
				first = append(first, p)
			}
		}
	}
	for _, batch := range [][]*Process{first, rest} {
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, p := range batch {
			wg.Go(func() { errs[i] = firstStart(ctx, p) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// routingProbe is the payment id that waitRouting asks for: one that does
// not exist.
const routingProbe = "idem-cluster-routing-probe"

// waitRouting waits until every node routes every placed tenant: GET
// /payments/<routingProbe> with the tenant's token is answered by the
// tenant's home region (404), not refused because the node has not yet
// seen the nodes of that region (a node learns of the others through an
// etcd watch, which may lag a little behind their readiness).
func (c *Cluster) waitRouting(ctx context.Context, timeout time.Duration) error {
	if len(c.placements) == 0 {
		return nil
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: c.ClientTLS()}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: probeTimeout}
	tenants := slices.Sorted(maps.Keys(c.placements))
	nodes := c.Nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, p := range nodes {
		wg.Go(func() {
			for _, t := range tenants {
				if errs[i] = waitRouted(ctx, client, p, t, c.tokens[t], c.placements[t]); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	c.log.Debug("cluster: every node routes every tenant", "elapsed", time.Since(began).Round(time.Millisecond))
	return errors.Join(errs...)
}

// waitRouted polls node p until a tenant's request is routed.
func waitRouted(ctx context.Context, client *http.Client, p *Process, tenant, token, home string) error {
	url := p.URL() + "/payments/" + routingProbe
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			if resp.StatusCode < 500 && resp.StatusCode != http.StatusMisdirectedRequest {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: node %s does not route %s's requests to its home region %s: %w (last answer: %s)",
				p.Name(), tenant, home, ctx.Err(), last)
		case <-time.After(readyPoll):
		}
	}
}

// firstStart starts a node or the provider on a free port and waits until
// it is ready, moving to another port if the one picked was taken
// meanwhile.
func firstStart(ctx context.Context, p *Process) error {
	for attempt := 1; ; attempt++ {
		addr := p.Addr()
		if p.ctr == nil {
			var err error
			if addr, err = freeAddr(); err != nil {
				return err
			}
			p.setAddr(addr)
		}
		if p.onAddr != nil {
			if err := p.onAddr(addr); err != nil {
				return err
			}
		}
		if err := p.start(); err != nil {
			return err
		}
		err := p.WaitReady(ctx)
		if err == nil {
			p.log.Info("cluster: "+p.kind+" ready", "name", p.Name(), "url", p.URL(), "pid", p.Pid())
			return nil
		}
		_ = p.Kill()
		if !errors.Is(err, errAddrInUse) || attempt == portAttempts || ctx.Err() != nil || p.ctr != nil {
			return err
		}
		p.log.Info("cluster: port taken, retrying", "name", p.Name(), "addr", addr)
	}
}

// Node returns node i (from 0) of region, or nil if there is no such node.
func (c *Cluster) Node(region string, i int) *Process {
	for _, r := range c.regions {
		if r.name == region && i >= 0 && i < len(r.nodes) {
			return r.nodes[i]
		}
	}
	return nil
}

// Nodes returns every node, region by region in Config order.
func (c *Cluster) Nodes() []*Process {
	var out []*Process
	for _, r := range c.regions {
		out = append(out, r.nodes...)
	}
	return out
}

// HomeRegion returns the region Start placed tenant in ("" without etcd,
// or for an unknown tenant). Placements may move later (package routing);
// this is the initial one.
func (c *Cluster) HomeRegion(tenant string) string { return c.placements[tenant] }

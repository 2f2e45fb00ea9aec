package region

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/sidecar"
)

// SidecarConfig makes routes of an existing HTTP service idempotent: the node
// serves them (authenticated and routed to the tenant's home region like
// its own API) and proxies them to the service (package sidecar).
type SidecarConfig struct {
	// Routes are the proxied routes (sidecar.ParseRoutes). None: no sidecar.
	// Their operations run in the node's engine (Config.Engine), fenced by
	// its Locker and recovered by its recovery worker like the node's own.
	Routes []sidecar.Route
}

// registerSidecar mounts the sidecar routes behind authenticated (so they
// are forwarded to the tenant's home region). The proxied namespace is the
// upstream's: a route may claim any path, /v1/... included, that none of
// the node's own endpoints (registered on mux before) lies under or above.
func (s *Server) registerSidecar(mux *routeMux) error {
	cfg := s.cfg.Sidecar
	if len(cfg.Routes) == 0 {
		return nil
	}
	for _, rt := range cfg.Routes {
		for _, pattern := range mux.patterns {
			p := literalPrefix(pattern)
			if underPath(rt.Prefix, p) || underPath(p, rt.Prefix) {
				return fmt.Errorf("region: proxied route %s %s overlaps the node's own endpoint %q", rt.Method, rt.Prefix, pattern)
			}
		}
		if rt.Wait >= s.cfg.WriteTimeout {
			// A held retry would be cut before it got the answer.
			return fmt.Errorf("region: proxied route %s %s: wait %v is not below the write timeout %v", rt.Method, rt.Prefix, rt.Wait, s.cfg.WriteTimeout)
		}
		if rt.Timeout >= s.cfg.WriteTimeout {
			// The node would cut the answer before the upstream gave it.
			return fmt.Errorf("region: proxied route %s %s: timeout %v is not below the write timeout %v", rt.Method, rt.Prefix, rt.Timeout, s.cfg.WriteTimeout)
		}
		if rt.Webhook != "" && !s.knowsTenant(rt.WebhookTenant) {
			// A peer forwards the route's deliveries to the tenant's home
			// region only for a tenant of the cluster's token table.
			return fmt.Errorf("region: webhook route %s %s: tenant %q has no token on this node", rt.Method, rt.Prefix, rt.WebhookTenant)
		}
		if _, own := s.own[rt.Operation]; own || s.operations[rt.Operation] {
			return fmt.Errorf("region: proxied route %s %s: operation %q is the node's own or the coordination API's", rt.Method, rt.Prefix, rt.Operation)
		}
	}
	metrics, err := idemprom.New(s.cfg.Registry)
	if err != nil {
		return fmt.Errorf("region: %w", err)
	}
	p, err := sidecar.New(s.engine, sidecar.Options{Routes: cfg.Routes, MaxBodyBytes: s.cfg.MaxBodyBytes, Errors: s.errors, Logger: s.logger, Metrics: metrics})
	if err != nil {
		return fmt.Errorf("region: %w", err)
	}
	for _, rt := range cfg.Routes {
		h := p.Handler(rt.Operation)
		serve := s.authenticated(func(w http.ResponseWriter, r *http.Request, tenant string) {
			h.ServeHTTP(w, r.WithContext(sidecar.WithTenant(r.Context(), tenant)))
		})
		if rt.Webhook != "" {
			serve = s.webhookRoute(p, rt, h)
		}
		for _, pattern := range rt.Patterns() {
			mux.HandleFunc(pattern, withErrors(p.Errors(rt.Operation), s.insideRoute(serve)))
		}
	}
	return nil
}

// insideRoute refuses a path that an upstream could resolve outside its
// route (sidecar.CheckPath: 400 REQUEST_PATH_INVALID) before anything is
// stored, forwarded to the tenant's home region or proxied. The mux
// redirects a path with an unencoded dot segment; it matches one whose
// dots or slashes are encoded ("/transfers/%2e%2e/admin") as any other.
func (s *Server) insideRoute(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := sidecar.CheckPath(r.URL.EscapedPath()); err != nil {
			s.writeError(w, r, err)
			return
		}
		next(w, r)
	}
}

// literalPrefix is the path of a mux pattern ("GET /v1/x/{id}/y") up to its
// first wildcard ("/v1/x"): every path the pattern matches lies under it.
func literalPrefix(pattern string) string {
	_, path, ok := strings.Cut(pattern, " ")
	if !ok {
		path = pattern
	}
	if i := strings.IndexByte(path, '{'); i >= 0 {
		path = path[:i]
	}
	if path != "/" {
		path = strings.TrimSuffix(path, "/")
	}
	return path
}

// underPath reports whether path is base or lies under it.
func underPath(path, base string) bool {
	return path == base || strings.HasPrefix(path, strings.TrimSuffix(base, "/")+"/")
}

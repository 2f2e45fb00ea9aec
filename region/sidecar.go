package region

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/sidecar"
)

// SidecarConfig makes routes of an existing HTTP service idempotent: the node
// serves them (authenticated and routed to the tenant's home region like
// its own API) and proxies them to the service (package sidecar).
type SidecarConfig struct {
	// Routes are the proxied routes (sidecar.ParseRoutes). None: no sidecar.
	Routes []sidecar.Route
	// Locker, when set, fences takeovers of the routes' records with an
	// external lock (etcd), as the node's own operations do.
	Locker engine.Locker
}

type sidecarState struct {
	engine *engine.Engine
	stop   context.CancelFunc
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
		if _, own := s.own[rt.Operation]; own || s.operations[rt.Operation] {
			return fmt.Errorf("region: proxied route %s %s: operation %q is the node's own or the coordination API's", rt.Method, rt.Prefix, rt.Operation)
		}
	}
	eopts := engine.Options{Owner: s.cfg.Region + "/" + s.cfg.NodeID + "/sidecar", HomeRegion: s.cfg.Region, Logger: s.logger}
	if cfg.Locker != nil {
		eopts.Locker = cfg.Locker
	}
	e := engine.New(s.store, eopts)
	p, err := sidecar.New(e, sidecar.Options{Routes: cfg.Routes, MaxRequestBody: s.cfg.MaxBodyBytes, Errors: s.errors, Logger: s.logger, Registerer: s.cfg.Registry})
	if err != nil {
		return fmt.Errorf("region: %w", err)
	}
	for _, rt := range cfg.Routes {
		h := p.Handler(rt.Operation)
		serve := s.authenticated(func(w http.ResponseWriter, r *http.Request, tenant string) {
			h.ServeHTTP(w, r.WithContext(sidecar.WithTenant(r.Context(), tenant)))
		})
		for _, pattern := range rt.Patterns() {
			mux.HandleFunc(pattern, serve)
		}
	}
	s.sidecar = &sidecarState{engine: e}
	return nil
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

// StartSidecarRecovery settles, every interval, the proxied routes' records
// nobody is working on (engine.Engine.Run): a record left before the
// upstream call is released for the client's retry; one left after it is
// settled by the route's lookup, or stays UNKNOWN_REQUIRES_RECOVERY. It
// does nothing without routes or with interval <= 0; Close stops it.
func (s *Server) StartSidecarRecovery(ctx context.Context, interval time.Duration) {
	if s.sidecar == nil || interval <= 0 {
		return
	}
	ctx, s.sidecar.stop = context.WithCancel(ctx)
	s.workers.Add(1)
	go func() {
		defer s.workers.Done()
		s.sidecar.engine.Run(ctx, interval, 0)
	}()
}

func (s *Server) stopSidecar() {
	if s.sidecar != nil && s.sidecar.stop != nil {
		s.sidecar.stop()
	}
}

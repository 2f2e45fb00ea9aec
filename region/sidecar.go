package region

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/sidecar"
)

// SidecarConfig makes routes of an existing HTTP service idempotent: the node
// serves them (authenticated and routed to the tenant's home region like
// its own API) and proxies them to the service (package sidecar).
type SidecarConfig struct {
	// Routes are the proxied routes (sidecar.ParseRoutes). None: no sidecar.
	Routes []sidecar.Route
	// Locker, when set, fences takeovers of the routes' records with an
	// external lock (etcd), as payments do.
	Locker engine.Locker
}

// reservedPrefixes are the node's own paths, which no proxied route may
// overlap.
var reservedPrefixes = []string{"/payments", "/v1", "/metrics", "/healthz", "/readyz"}

type sidecarState struct {
	engine *engine.Engine
	stop   context.CancelFunc
}

// registerSidecar mounts the sidecar routes behind authenticated (so they
// are forwarded to the tenant's home region).
func (s *Server) registerSidecar(mux *routeMux) error {
	cfg := s.cfg.Sidecar
	if len(cfg.Routes) == 0 {
		return nil
	}
	for _, rt := range cfg.Routes {
		for _, p := range reservedPrefixes {
			if underPath(rt.Prefix, p) || underPath(p, rt.Prefix) {
				return fmt.Errorf("region: proxied route %s %s overlaps the node's own %s", rt.Method, rt.Prefix, p)
			}
		}
		if rt.Timeout >= s.cfg.WriteTimeout {
			// The node would cut the answer before the upstream gave it.
			return fmt.Errorf("region: proxied route %s %s: timeout %v is not below the write timeout %v", rt.Method, rt.Prefix, rt.Timeout, s.cfg.WriteTimeout)
		}
		if rt.Operation == payments.Operation || s.operations[rt.Operation] {
			return fmt.Errorf("region: proxied route %s %s: operation %q is the node's own or the coordination API's", rt.Method, rt.Prefix, rt.Operation)
		}
	}
	eopts := engine.Options{Owner: s.cfg.Region + "/" + s.cfg.NodeID + "/sidecar", HomeRegion: s.cfg.Region, Logger: s.logger}
	if cfg.Locker != nil {
		eopts.Locker = cfg.Locker
	}
	e := engine.New(s.store, eopts)
	p, err := sidecar.New(e, sidecar.Options{Routes: cfg.Routes, MaxRequestBody: s.cfg.MaxBodyBytes, Logger: s.logger, Registerer: s.cfg.Registry})
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

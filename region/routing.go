package region

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/routing"
)

// HeaderForwardedBy marks a request forwarded to the tenant's home region:
// "Idem-Forwarded-By: <region>/<node>; hops=<n>".
const HeaderForwardedBy = "Idem-Forwarded-By"

// maxHops is how many times a request may be forwarded.
const maxHops = 1

type routeKey struct{}

// routeOf returns the route the request was admitted under (zero without a
// router).
func routeOf(ctx context.Context) routing.Route {
	rt, _ := ctx.Value(routeKey{}).(routing.Route)
	return rt
}

// hopsOf reads the hop count of Idem-Forwarded-By (0 when absent).
func hopsOf(h http.Header) int {
	v := h.Get(HeaderForwardedBy)
	if v == "" {
		return 0
	}
	for _, part := range strings.Split(v, ";") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(part), "hops="); ok {
			if hops, err := strconv.Atoi(n); err == nil {
				return hops
			}
		}
	}
	return maxHops // present but unreadable: treat as already forwarded
}

// routed admits a tenant's request: served here when this node's region is
// the tenant's home (and holds its lease), or forwarded once to a node of the
// home region. A request that would be forwarded a second time is refused
// with 508 IDEMPOTENCY_ROUTING_LOOP.
func (s *Server) routed(h tenantHandler) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		if s.cfg.Router == nil {
			h(w, r, tenant)
			return
		}
		rt, err := s.cfg.Router.Route(r.Context(), tenant)
		if err != nil {
			writeError(w, r, s.logger, err)
			return
		}
		if rt.ForwardTo == "" {
			h(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)), tenant)
			return
		}
		hops := hopsOf(r.Header)
		if hops >= maxHops {
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeRoutingLoop,
				"The request was already forwarded (%s) and would be forwarded again to %s.", r.Header.Get(HeaderForwardedBy), rt.Placement.Region))
			return
		}
		target, err := url.Parse(rt.ForwardTo)
		if err != nil {
			writeError(w, r, s.logger, fmt.Errorf("region: bad node url %q: %w", rt.ForwardTo, err))
			return
		}
		s.metrics.forwarded.WithLabelValues(rt.Placement.Region).Inc()
		proxy := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.Header.Set(HeaderForwardedBy, fmt.Sprintf("%s/%s; hops=%d", s.cfg.Region, s.cfg.NodeID, hops+1))
			},
			Transport: s.forwardTransport,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				writeError(w, r, s.logger, &idem.Error{Code: idem.ECodeUnavailable,
					Message: "The tenant's home region could not be reached; retry with the same key.", Err: err})
			},
		}
		proxy.ServeHTTP(w, r)
	}
}

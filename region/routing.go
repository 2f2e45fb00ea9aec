package region

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/routing"
)

// Headers of a request forwarded between nodes.
const (
	// HeaderForwardedBy marks a request forwarded to the tenant's home
	// region: "Idem-Forwarded-By: <region>/<node>; hops=<n>". A node
	// accepts it only from an authenticated peer.
	HeaderForwardedBy = "Idem-Forwarded-By"
	// HeaderTenant carries the tenant of a forwarded request, stated by the
	// authenticated forwarding node; the client's bearer token is not
	// forwarded.
	HeaderTenant = "Idem-Tenant"
	// HeaderPeerSecret carries the cluster's peer secret on requests
	// forwarded between nodes that authenticate each other by secret
	// (Config.PeerSecret) rather than by certificate.
	HeaderPeerSecret = "Idem-Peer-Secret"
)

// maxHops is how many times a request may be forwarded.
const maxHops = 1

type routeKey struct{}

// UncertainRoute reports whether the request of ctx (one an Operation's
// route serves) was admitted while its tenant's placement was uncertain: a
// failover under way, where the tenant's previous home may still hold work
// of its own (routing.Route.Uncertain).
func UncertainRoute(ctx context.Context) bool { return routeOf(ctx).Uncertain }

// routeOf returns the route the request was admitted under (zero without a
// router).
func routeOf(ctx context.Context) routing.Route {
	rt, _ := ctx.Value(routeKey{}).(routing.Route)
	return rt
}

// parseForwardedBy reads "<region>/<node>; hops=<n>" with n from 1 to
// maxHops, and nothing else.
func parseForwardedBy(v string) (routing.Peer, int, bool) {
	by, n, ok := strings.Cut(v, "; hops=")
	if !ok {
		return routing.Peer{}, 0, false
	}
	peer, ok := routing.ParsePeer(by)
	if !ok {
		return routing.Peer{}, 0, false
	}
	hops, err := strconv.Atoi(n)
	if err != nil || strconv.Itoa(hops) != n || hops < 1 || hops > maxHops {
		return routing.Peer{}, 0, false
	}
	return peer, hops, true
}

// errNotPeer answers a request that claims to be forwarded by a node but
// does not come from an authenticated peer, or not in the form peers use.
var errNotPeer = idem.Errorf(idem.ECodeForwardingNotAuthenticated,
	"Only an authenticated node of this cluster may forward requests.")

// peerAuthenticated reports whether the request comes from an
// authenticated peer and, for a certificate, which one: a client
// certificate verified against Config.PeerCAs that names a node, or the
// cluster's peer secret.
func (s *Server) peerAuthenticated(r *http.Request) (peer routing.Peer, byCert, ok bool) {
	if s.cfg.PeerCAs != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		raw := make([][]byte, len(r.TLS.PeerCertificates))
		for i, c := range r.TLS.PeerCertificates {
			raw[i] = c.Raw
		}
		if leaf, err := s.cfg.PeerCAs.Verify(raw, x509.ExtKeyUsageClientAuth); err == nil {
			if p, ok := routing.PeerOf(leaf); ok {
				return p, true, true
			}
		}
	}
	if len(s.cfg.PeerSecret) > 0 {
		got := r.Header.Get(HeaderPeerSecret)
		if got != "" && subtle.ConstantTimeCompare([]byte(got), s.cfg.PeerSecret) == 1 {
			return routing.Peer{}, false, true
		}
	}
	return routing.Peer{}, false, false
}

// forwarded admits a request forwarded by another node: only from an
// authenticated peer, with a well-formed Idem-Forwarded-By naming that peer
// and an Idem-Tenant this node knows. It returns the tenant and the hop
// count.
func (s *Server) forwarded(r *http.Request) (string, int, error) {
	vals := r.Header.Values(HeaderForwardedBy)
	peer, byCert, ok := s.peerAuthenticated(r)
	if !ok {
		return "", 0, errNotPeer
	}
	if len(vals) != 1 {
		return "", 0, errNotPeer
	}
	by, hops, ok := parseForwardedBy(vals[0])
	if !ok || (byCert && by != peer) {
		return "", 0, errNotPeer
	}
	tenants := r.Header.Values(HeaderTenant)
	if len(tenants) != 1 || !s.knowsTenant(tenants[0]) {
		return "", 0, errNotPeer
	}
	return tenants[0], hops, nil
}

// knowsTenant reports whether tenant has a token on this node.
func (s *Server) knowsTenant(tenant string) bool {
	for _, t := range s.cfg.Tokens {
		if t == tenant {
			return true
		}
	}
	return false
}

// routed admits a tenant's request: served here when this node's region is
// the tenant's home (and holds its lease), or forwarded once to a node of the
// home region. A request that would be forwarded a second time is refused
// with 508 IDEMPOTENCY_ROUTING_LOOP.
func (s *Server) routed(h tenantHandler, hops int) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.noteRequest(r, tenant)
		if s.cfg.Router == nil {
			h(w, r, tenant)
			return
		}
		rt, err := s.cfg.Router.Route(r.Context(), tenant)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if rt.ForwardTo == "" {
			h(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)), tenant)
			return
		}
		if hops >= maxHops {
			s.writeError(w, r, idem.Errorf(idem.ECodeRoutingLoop,
				"The request was already forwarded once and would be forwarded again."))
			return
		}
		target, err := url.Parse(rt.ForwardTo)
		if err != nil {
			s.writeError(w, r, fmt.Errorf("region: bad node url %q: %w", rt.ForwardTo, err))
			return
		}
		peer := routing.Peer{Region: rt.Placement.Region, Node: rt.ForwardNode}
		transport, bySecret, err := s.transportTo(target, peer)
		if err != nil {
			s.logger.WarnContext(r.Context(), "cannot forward", "to", peer.String(), "url", rt.ForwardTo, "err", err)
			s.writeError(w, r, idem.Errorf(idem.ECodeNotHome,
				"This node cannot forward to the tenant's home region; retry later."))
			return
		}
		s.metrics.forwarded.WithLabelValues(rt.Placement.Region).Inc()
		proxy := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				out := pr.Out.Header
				// The home node trusts this node's statement of the tenant;
				// the client's credentials stay here.
				out.Del("Authorization")
				out.Del(HeaderPeerSecret)
				out.Set(HeaderTenant, tenant)
				out.Set(HeaderForwardedBy, fmt.Sprintf("%s/%s; hops=%d", s.cfg.Region, s.cfg.NodeID, hops+1))
				if bySecret {
					out.Set(HeaderPeerSecret, string(s.cfg.PeerSecret))
				}
				telemetry.Inject(pr.Out.Context(), out)
			},
			Transport: transport,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				s.writeError(w, r, &idem.Error{Code: idem.ECodeUnavailable,
					Message: "The tenant's home region could not be reached; retry with the same key.", Err: err})
			},
		}
		ctx, done := s.forwardSpan(r.Context(), rt.Placement.Region, rt.ForwardNode)
		defer done()
		proxy.ServeHTTP(w, r.WithContext(ctx))
	}
}

// peerIdleConns is how many idle connections a node keeps to each peer: a
// region forwards many concurrent requests to few nodes, and net/http's
// default of 2 per host closed the rest after each answer, so across a WAN
// most forwarded requests paid a new TCP (and TLS) handshake.
const peerIdleConns = 64

// newPeerTransport is the transport of forwarded requests: net/http's
// defaults with peerIdleConns idle connections per peer.
func newPeerTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = peerIdleConns
	t.MaxIdleConns = 4 * peerIdleConns
	return t
}

// peerTransports holds one transport per peer identity, so that a pooled
// connection is only ever reused for the peer it was verified as.
type peerTransports struct {
	mu sync.Mutex
	m  map[routing.Peer]*http.Transport
}

func (p *peerTransports) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.m {
		t.CloseIdleConnections()
	}
}

// transportTo returns the transport for forwarding to peer at target, and
// whether the request must carry the peer secret. With mTLS (PeerCAs and
// PeerCert) only over HTTPS, verifying that the target's certificate is
// issued by PeerCAs to exactly that region and node (not to its host name,
// which may be a proxy's) and presenting PeerCert: such a node never
// downgrades to plain HTTP. Without mTLS, with the peer secret, over HTTP or
// HTTPS (verified against the system's roots).
func (s *Server) transportTo(target *url.URL, peer routing.Peer) (http.RoundTripper, bool, error) {
	if peer.Node == "" {
		return nil, false, errors.New("no node id for the target")
	}
	mtls := s.cfg.PeerCAs != nil && s.cfg.PeerCert != nil
	switch {
	case target.Scheme != "http" && target.Scheme != "https":
		return nil, false, fmt.Errorf("unsupported scheme %q", target.Scheme)
	case mtls && target.Scheme == "http":
		return nil, false, errors.New("refusing to forward over plain HTTP with mTLS configured")
	case !mtls && len(s.cfg.PeerSecret) == 0:
		return nil, false, errors.New("neither mTLS nor a peer secret to authenticate with")
	case !mtls:
		return s.forwardTransport, true, nil
	}
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	if t, ok := s.peers.m[peer]; ok {
		return t, false, nil
	}
	if s.peers.m == nil {
		s.peers.m = map[routing.Peer]*http.Transport{}
	}
	t := newPeerTransport()
	t.TLSClientConfig = peerClientConfig(s.cfg.PeerCAs, s.cfg.PeerCert, peer)
	s.peers.m[peer] = t
	return t, false, nil
}

// peerClientConfig verifies that the server is the node peer.
func peerClientConfig(cas *tlsutil.Pool, cert *tlsutil.Reloader, peer routing.Peer) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetClientCertificate: cert.GetClientCertificate,
		// The chain and the identity are checked in VerifyConnection: the
		// host name is the proxy's or an address, not the node's name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			raw := make([][]byte, len(cs.PeerCertificates))
			for i, c := range cs.PeerCertificates {
				raw[i] = c.Raw
			}
			leaf, err := cas.Verify(raw, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if got, ok := routing.PeerOf(leaf); !ok || got != peer {
				return fmt.Errorf("region: the certificate names %v (%v), not %s", leaf.URIs, ok, peer)
			}
			return nil
		},
	}
}

package region

import (
	"net/http"

	"github.com/idemcoord/idem/sidecar"
)

// webhookRoute serves a sidecar webhook route (sidecar.Route.Webhook). Its
// senders carry no bearer token: the signature, verified before anything
// is stored or forwarded (sidecar.Proxy.VerifyWebhook), admits a delivery
// as the route's tenant, which is then routed to the tenant's home region
// like any of its requests. A delivery a peer forwards is admitted as any
// forwarded request is (an authenticated peer), for the route's tenant
// only, and the home node's proxy verifies its signature again before it
// stores anything.
func (s *Server) webhookRoute(p *sidecar.Proxy, rt sidecar.Route, h http.Handler) http.HandlerFunc {
	serve := func(w http.ResponseWriter, r *http.Request, tenant string) {
		if tenant != rt.WebhookTenant {
			s.writeError(w, r, errNotPeer)
			return
		}
		h.ServeHTTP(w, r)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if _, forwarded := r.Header[HeaderForwardedBy]; forwarded {
			s.authenticated(serve)(w, r)
			return
		}
		verified, err := p.VerifyWebhook(rt.Operation, r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		s.routed(serve, 0)(w, verified, rt.WebhookTenant)
	}
}

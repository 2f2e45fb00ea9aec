package region

import (
	"net/http"

	"github.com/idemcoord/idem/idemhttp"
)

// declaredBodyLimit answers 413 REQUEST_BODY_TOO_LARGE to a request whose
// Content-Length is over MaxBodyBytes before any handler runs, on every
// surface of the node (its own operations' routes, the coordination API,
// the sidecar routes) and before a request is forwarded to the tenant's
// home region. Nothing reads the body first, so a client that sent
// Expect: 100-continue gets the 413 instead of a 100 Continue that invites
// a body only to cut it (net/http sends 100 Continue when a handler first
// reads the body), and net/http closes the connection after the answer
// rather than read what the client may still send. A body of undeclared
// length (chunked) is cut at the limit as it is read, as before.
//
// The refused request keeps the pattern it would have been served by, for
// the metrics and the trace.
func (s *Server) declaredBodyLimit(mux *routeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := idemhttp.CheckContentLength(r, s.cfg.MaxBodyBytes); err != nil {
			_, r.Pattern = mux.Handler(r)
			s.writeError(w, r, err)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

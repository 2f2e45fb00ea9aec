package region

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/idemcoord/idem/idemhttp"
)

// nodeErrors is the node's one table of error codes: package idem's
// (idemhttp.DefaultErrors) and those its operations declare
// (Operation.Errors). Every surface of the node answers through it.
func nodeErrors(ops []Operation) (*idemhttp.Errors, error) {
	t := idemhttp.DefaultErrors()
	for _, op := range ops {
		var err error
		if t, err = t.With(op.Errors); err != nil {
			return nil, fmt.Errorf("region: operation %q: %w", op.Name, err)
		}
	}
	return t, nil
}

// Errors returns the node's table of error codes.
func (s *Server) Errors() *idemhttp.Errors { return s.errors }

// WriteError answers err as problem+json (RFC 9457) by the node's table,
// as the node answers its own errors: for an Operation's handlers. Internal
// details are logged, never sent.
func (s *Server) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	s.writeError(w, r, err)
}

// writeError answers err as problem+json (RFC 9457) by the node's table,
// or by the table a proxied route put in the request's context (its error
// envelope: withErrors). Internal details are logged, never sent.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	t := s.errors
	if rt, ok := r.Context().Value(errorsKey{}).(*idemhttp.Errors); ok {
		t = rt
	}
	t.Write(w, r, s.logger, err)
}

type errorsKey struct{}

// withErrors answers the errors the node writes for next's requests
// (authentication, routing) by t: a proxied route's table, so that its
// clients get every error in the route's envelope.
func withErrors(t *idemhttp.Errors, next http.HandlerFunc) http.HandlerFunc {
	if t == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		next(w, r.WithContext(context.WithValue(r.Context(), errorsKey{}, t)))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"errorCode":"INTERNAL","message":"Internal error."}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

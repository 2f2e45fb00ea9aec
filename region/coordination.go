package region

import "net/http"

// registerCoordination mounts the coordination API.
func (s *Server) registerCoordination(mux *http.ServeMux) {}

package region

import (
	"net/http"
	"time"

	"github.com/idemcoord/idem"
)

// The coordination API exposes the idem.Coordinator contract over HTTP, for
// services that are not written in Go (package coordclient is the Go client).
// The tenant always comes from the bearer token; {operation} and {key} are
// path segments (percent-encode "/" as %2F); neither may be "." or ".."
// (idem.ValidKey, idem.ValidOperation), which path cleaning would resolve.
//
//	POST /v1/coordination/{operation}/{key}/begin       -> 200 {"outcome",...}
//	POST /v1/coordination/{operation}/{key}/checkpoint  -> 204
//	POST /v1/coordination/{operation}/{key}/complete    -> 204
//	POST /v1/coordination/{operation}/{key}/fail        -> 204
//	GET  /v1/coordination/{operation}/{key}             -> 200 {"record","response"}
//
// docs/openapi.yaml describes the bodies.

// Limits of the coordination API.
const (
	maxOwnerLen = 128 // characters
	// A claim id is drawn at random per request: at least 16 characters,
	// so that two requests do not share one by accident (see
	// coordapi.BeginRequest.ClaimID).
	minClaimIDLen       = 16
	maxClaimIDLen       = 64
	maxRequestHashLen   = 256
	maxCheckpointLen    = 64
	maxErrorCodeLen     = 128
	maxResourceTypeLen  = 64
	maxResourceIDLen    = 255
	maxSchemaVersionLen = 32
	maxReplayHeaders    = 64
	maxHeaderNameLen    = 256
	maxHeaderValueLen   = 8 << 10

	defaultLockTimeout = 30 * time.Second
	maxLockTimeout     = time.Hour
	maxWindow          = 30 * 24 * time.Hour
)

const coordPrefix = "/v1/coordination/{operation}/{key}"

func (s *Server) registerCoordination(mux *routeMux) {
	mux.HandleFunc("POST "+coordPrefix+"/begin", s.authenticated(s.handleCoordBegin))
	mux.HandleFunc("POST "+coordPrefix+"/checkpoint", s.authenticated(s.handleCoordCheckpoint))
	mux.HandleFunc("POST "+coordPrefix+"/complete", s.authenticated(s.handleCoordComplete))
	mux.HandleFunc("POST "+coordPrefix+"/fail", s.authenticated(s.handleCoordFail))
	mux.HandleFunc("GET "+coordPrefix, s.authenticated(s.handleCoordGet))
	for p, allow := range map[string]string{
		coordPrefix + "/begin":      http.MethodPost,
		coordPrefix + "/checkpoint": http.MethodPost,
		coordPrefix + "/complete":   http.MethodPost,
		coordPrefix + "/fail":       http.MethodPost,
		coordPrefix:                 "GET, HEAD",
	} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.writeError(w, r, idem.Errorf(idem.ECodeMethodNotAllowed, "The method is not allowed here."))
		})
	}
}

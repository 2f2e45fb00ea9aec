package depcheck_test

import (
	"net/http"
	"testing"

	// The library packages whose dependencies register nothing. fencing
	// and idemgrpc (gRPC: /debug/requests, /debug/events) and idemprom (client_golang:
	// expvar's /debug/vars) are left out: see registersVia in
	// deps_test.go.
	_ "github.com/idemcoord/idem"
	_ "github.com/idemcoord/idem/coordclient"
	_ "github.com/idemcoord/idem/engine"
	_ "github.com/idemcoord/idem/fingerprint"
	_ "github.com/idemcoord/idem/idemhttp"
	_ "github.com/idemcoord/idem/memcoord"
	_ "github.com/idemcoord/idem/sidecar"
	_ "github.com/idemcoord/idem/store"
)

// TestNothingOnDefaultServeMux: a program importing the engine and the HTTP
// middleware and sidecar (and store, coordclient, fingerprint, memcoord, the
// root package) serves nothing on
// http.DefaultServeMux: no pprof, no expvar, no catch-all. This test
// binary links nothing else that could register: keep this package's
// imports to the standard library and the packages above.
func TestNothingOnDefaultServeMux(t *testing.T) {
	for _, path := range []string{"/", "/debug/pprof/", "/debug/pprof/profile", "/debug/vars",
		"/debug/requests", "/debug/events", "/metrics"} {
		req, err := http.NewRequest(http.MethodGet, "http://localhost"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, pattern := http.DefaultServeMux.Handler(req); pattern != "" {
			t.Errorf("GET %s: http.DefaultServeMux has a handler for %q; want none", path, pattern)
		}
	}
}

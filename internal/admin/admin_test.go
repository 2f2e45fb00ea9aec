package admin_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/idemcoord/idem/internal/admin"
)

// TestHandler: the handler serves pprof, expvar and the build information
// on its own mux.
func TestHandler(t *testing.T) {
	h := admin.Handler()
	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/goroutine?debug=1": 200,
		"/debug/vars": 200, "/debug/buildinfo": 200, "/": 404} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want {
			t.Errorf("GET %s: %d, want %d", path, rec.Code, want)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/buildinfo", nil))
	var info struct{ Version, GoVersion string }
	if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil {
		t.Fatalf("buildinfo: %v: %s", err, rec.Body.Bytes())
	}
	if info.GoVersion != runtime.Version() || info.Version == "" {
		t.Errorf("buildinfo = %+v, want goversion %s and a version", info, runtime.Version())
	}
}

// Package admin serves what an operator inspects a running process with:
// net/http/pprof, expvar and the build information.
//
// Importing net/http/pprof or expvar registers their handlers on
// http.DefaultServeMux, in every program that links them. So only main
// packages (cmd/idemd) import this package; a library package never does,
// and internal/depcheck's tests keep it that way.
package admin

import (
	"encoding/json"
	"expvar"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/debug"

	"github.com/idemcoord/idem/internal/telemetry"
)

// Handler serves, on a listener of its own that is never the public one:
// net/http/pprof under /debug/pprof/, expvar at /debug/vars and the build
// information (version, Go version, module versions and build settings)
// at /debug/buildinfo.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/vars", expvar.Handler())
	mux.HandleFunc("GET /debug/buildinfo", func(w http.ResponseWriter, r *http.Request) {
		v := map[string]any{"version": telemetry.BuildVersion(), "goversion": runtime.Version()}
		if bi, ok := debug.ReadBuildInfo(); ok {
			v["path"], v["deps"], v["settings"] = bi.Path, bi.Deps, bi.Settings
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	})
	return mux
}

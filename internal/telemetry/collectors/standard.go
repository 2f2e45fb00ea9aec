package telemetry

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Version is the program's version. Set it at build time with
// -ldflags "-X github.com/idemcoord/idem/internal/telemetry.Version=v1.2.3";
// empty, it is the main module's version from the build information
// ("(devel)" for a build from a work tree).
var Version = ""

// BuildVersion returns Version, or the main module's version recorded in
// the binary, or "unknown".
func BuildVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
}

// RegisterStandard registers on reg the collectors every registry of the
// service carries: the Go runtime's (go_*), the process's (process_*) and
// idem_build_info{version,goversion}, a constant 1.
func RegisterStandard(reg prometheus.Registerer) error {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idem_build_info",
		Help:        "A constant 1, labelled with the program's version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": BuildVersion(), "goversion": runtime.Version()},
	})
	info.Set(1)
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		info,
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

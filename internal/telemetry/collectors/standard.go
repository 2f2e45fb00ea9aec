package collectors

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	promcollectors "github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemcoord/idem/internal/telemetry"
)

// RegisterStandard registers on reg the collectors every registry of the
// service carries: the Go runtime's (go_*), the process's (process_*) and
// idem_build_info{version,goversion}, a constant 1.
func RegisterStandard(reg prometheus.Registerer) error {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idem_build_info",
		Help:        "A constant 1, labelled with the program's version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": telemetry.BuildVersion(), "goversion": runtime.Version()},
	})
	info.Set(1)
	for _, c := range []prometheus.Collector{
		promcollectors.NewGoCollector(),
		promcollectors.NewProcessCollector(promcollectors.ProcessCollectorOpts{}),
		info,
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/idemcoord/idem/internal/admin"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/internal/telemetry/collectors"
	"github.com/idemcoord/idem/internal/telemetry/otlp"
)

// Ops are the flags an operator sees the node through: logs, traces and
// the admin listener.
type Ops struct {
	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// LogFormat is text (default) or json.
	LogFormat string
	// OTLPEndpoint, if set, exports traces to this OTLP gRPC collector.
	// Without it, OTEL_EXPORTER_OTLP_ENDPOINT does the same; with neither,
	// tracing is off.
	OTLPEndpoint string
	// AdminListen, if set, serves pprof, expvar and the build information
	// on this address, apart from the public one. Default: off.
	AdminListen string
}

// opsState is what Run starts for Ops and Close stops.
type opsState struct {
	registry *prometheus.Registry
	tracer   *sdktrace.TracerProvider
	etcdDial []grpc.DialOption
	admin    *http.Server
	adminLn  net.Listener
	adminErr chan error
}

func (o *Ops) register(fs *flag.FlagSet) {
	fs.StringVar(&o.LogLevel, "log-level", "info", "least severe log level written: debug, info, warn or error (debug logs one line per request)")
	fs.StringVar(&o.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.OTLPEndpoint, "otlp-endpoint", "", "OTLP gRPC collector to export traces to (http://host:4317 plain, https:// TLS); empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else tracing off")
	fs.StringVar(&o.AdminListen, "admin-listen", "", "address of the admin listener (pprof, expvar, build info); keep it private; empty: off")
}

// applyOps rebuilds the logger from --log-level and --log-format, unless
// the embedding program replaced the default one.
func (m *Main) applyOps() error {
	logger, err := telemetry.NewLogger(os.Stderr, m.Ops.LogLevel, m.Ops.LogFormat)
	if err != nil {
		return err
	}
	if m.logger == m.defaultLogger {
		m.logger, m.defaultLogger = logger, logger
	}
	return nil
}

// startOps creates the node's registry (with the etcd client's metrics),
// its tracer provider when an OTLP endpoint is configured, and the admin
// listener.
func (m *Main) startOps(ctx context.Context) error {
	m.ops.registry = prometheus.NewRegistry()
	var err error
	if m.ops.etcdDial, err = collectors.EtcdClientMetrics(m.ops.registry); err != nil {
		return err
	}
	getenv := m.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if m.Ops.OTLPEndpoint != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		m.ops.tracer, err = otlp.NewTracerProvider(ctx, otlp.Config{
			Endpoint: m.Ops.OTLPEndpoint, Service: "idemd", Region: m.Region, Node: m.NodeID,
		})
		if err != nil {
			return err
		}
	}
	if m.Ops.AdminListen != "" {
		if m.ops.adminLn, err = net.Listen("tcp", m.Ops.AdminListen); err != nil {
			return fmt.Errorf("--admin-listen: %w", err)
		}
		m.ops.admin = &http.Server{Handler: admin.Handler(), ReadHeaderTimeout: 5 * time.Second}
		m.ops.adminErr = make(chan error, 1)
		go func() { m.ops.adminErr <- m.ops.admin.Serve(m.ops.adminLn) }()
		m.logger.Info("admin listener serving", "url", m.AdminURL())
	}
	return nil
}

// AdminURL returns the admin listener's base URL, or "" when it is off.
func (m *Main) AdminURL() string {
	if m.ops.adminLn == nil {
		return ""
	}
	return "http://" + m.ops.adminLn.Addr().String()
}

// stopOps stops the admin listener and flushes the traces (for at most
// 2s).
func (m *Main) stopOps(ctx context.Context) error {
	var err error
	if m.ops.admin != nil {
		err = m.ops.admin.Shutdown(ctx)
		if serveErr := <-m.ops.adminErr; !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
	}
	if m.ops.tracer != nil {
		// Unflushed spans are lost, not a failure of the node: an
		// unreachable collector must not hold up or fail its exit.
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if terr := m.ops.tracer.Shutdown(tctx); terr != nil {
			m.logger.Warn("traces not flushed to the collector", "err", terr)
		}
	}
	return err
}

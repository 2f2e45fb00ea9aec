package region

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/internal/telemetry/collectors"
	"github.com/idemcoord/idem/store"
)

// observability is what a node adds for its operators beyond its own
// metrics: the standard collectors, the store pool's statistics, the
// forward latency, the tracer and request-scoped logging.
type observability struct {
	tracer  trace.Tracer
	tracing bool
	// forwardDuration times requests forwarded to a home region, from the
	// decision to forward to the home node's answer.
	forwardDuration *prometheus.HistogramVec
}

// newObservability registers the standard collectors (Go runtime,
// process, build info), the store pool's statistics and the forward latency
// on reg.
func newObservability(cfg Config, st *store.Store, reg prometheus.Registerer) (*observability, error) {
	o := &observability{
		tracer:  telemetry.Tracer(cfg.TracerProvider),
		tracing: cfg.TracerProvider != nil,
		forwardDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idempotency_forward_duration_seconds", Help: "Latency of requests forwarded to the tenant's home region (including the home node's processing), by home region.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"home_region"}),
	}
	if err := collectors.RegisterStandard(reg); err != nil {
		return nil, err
	}
	for _, c := range []prometheus.Collector{collectors.NewPoolCollector(st.Pool()), o.forwardDuration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// observed is the outermost middleware: it gives the request its log
// fields (region, node, and later tenant, operation and key hash), takes
// the caller's W3C trace context, starts the request's server span when
// tracing is on, and logs one line per request at debug level.
func (s *Server) observed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		f := &telemetry.RequestFields{Region: s.cfg.Region, Node: s.cfg.NodeID}
		ctx := telemetry.WithRequest(telemetry.Extract(r.Context(), r.Header), f)
		span := trace.SpanFromContext(context.Background())
		if s.obs.tracing {
			ctx, span = s.obs.tracer.Start(ctx, methodOf(r), trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.String("http.request.method", methodOf(r)),
					attribute.String("idem.region", s.cfg.Region), attribute.String("idem.node", s.cfg.NodeID)))
		}
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		if span.IsRecording() {
			span.SetName(route)
			span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", sw.status))
			for _, a := range [...]struct{ k, v string }{{"idem.tenant", f.Tenant}, {"idem.operation", f.Operation}, {"idem.key_hash", f.KeyHash}} {
				if a.v != "" {
					span.SetAttributes(attribute.String(a.k, a.v))
				}
			}
			if sw.status >= 500 {
				span.SetStatus(codes.Error, strconv.Itoa(sw.status))
			}
			span.End()
		}
		if s.logger.Enabled(ctx, slog.LevelDebug) {
			s.logger.DebugContext(ctx, "request", "method", methodOf(r), "route", route, "status", sw.status,
				"duration", time.Since(start))
		}
	})
}

// methodOf returns the request's method if it is a standard one, else
// "_OTHER": a log field or span attribute never echoes what an
// unauthenticated client sent.
func methodOf(r *http.Request) string {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return r.Method
	}
	return "_OTHER"
}

// noteRequest records the tenant, operation and key hash of an
// authenticated request in its log fields. The key itself is never logged.
func (s *Server) noteRequest(r *http.Request, tenant string) {
	f := telemetry.RequestOf(r.Context())
	if f == nil {
		return
	}
	f.Tenant = tenant
	op, key := r.PathValue("operation"), r.PathValue("key")
	if name, ok := s.routeOps[r.Pattern]; ok {
		// An endpoint of one of the node's own operations.
		op, key = name, r.Header.Get("Idempotency-Key")
	}
	if idem.ValidOperation(op) {
		f.Operation = op
	}
	if key != "" {
		f.KeyHash = telemetry.KeyHash(key)
	}
}

// forwardSpan starts the span of a forward to homeRegion (none when the
// request is not traced); its context carries the traceparent the home node
// continues the trace from. done ends it and times the forward.
func (s *Server) forwardSpan(ctx context.Context, homeRegion, node string) (context.Context, func()) {
	start := time.Now()
	ctx, span := telemetry.Start(ctx, "forward", trace.SpanKindClient,
		attribute.String("idem.home_region", homeRegion), attribute.String("idem.home_node", node))
	return ctx, func() {
		s.obs.forwardDuration.WithLabelValues(homeRegion).Observe(time.Since(start).Seconds())
		span.End()
	}
}

// tracedPass runs one pass of a background worker, in a root span of its
// own when tracing is on.
func (s *Server) tracedPass(ctx context.Context, name string, fn func(context.Context) error) error {
	if !s.obs.tracing {
		return fn(ctx)
	}
	ctx, span := s.obs.tracer.Start(ctx, "worker "+name, trace.WithNewRoot(),
		trace.WithAttributes(attribute.String("idem.region", s.cfg.Region), attribute.String("idem.node", s.cfg.NodeID)))
	defer span.End()
	err := fn(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	return err
}

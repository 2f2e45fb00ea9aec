// Package otlp sets up the export of a node's traces: an OpenTelemetry SDK
// tracer provider that batches spans to an OTLP gRPC collector.
//
// It is apart from package telemetry because the SDK and the exporter (and
// gRPC with them) belong in the programs that export, not in the library
// packages that start spans: those take their tracer from the context or
// from an injected trace.TracerProvider. Only main packages (cmd/idemd)
// import it.
package otlp

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemcoord/idem/internal/telemetry"
)

// Config configures NewTracerProvider.
type Config struct {
	// Endpoint is the OTLP gRPC collector: a URL (http:// for plain text,
	// https:// for TLS) or host:port (plain text). Empty: the exporter's
	// standard environment (OTEL_EXPORTER_OTLP_ENDPOINT and friends).
	Endpoint string
	// Service, Region and Node describe the resource: service.name,
	// idem.region, service.instance.id.
	Service, Region, Node string
}

// NewTracerProvider returns a tracer provider that batches spans to an
// OTLP gRPC collector. The caller owns it: Shutdown flushes and stops it.
// The exporter connects lazily; an unreachable collector loses spans, not
// requests.
func NewTracerProvider(ctx context.Context, cfg Config) (*sdktrace.TracerProvider, error) {
	var opts []otlptracegrpc.Option
	switch {
	case cfg.Endpoint == "":
	case strings.Contains(cfg.Endpoint, "://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	default:
		opts = append(opts, otlptracegrpc.WithEndpoint(cfg.Endpoint), otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp: exporter: %w", err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(cfg.Service),
		semconv.ServiceInstanceID(cfg.Node),
		semconv.ServiceVersion(telemetry.BuildVersion()),
		attribute.String("idem.region", cfg.Region),
	)
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

package payments

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/provider"
)

// tracedProvider gives every provider call a span, a child of the request's
// or the recovery pass's (none when they are not traced).
type tracedProvider struct{ p Provider }

// Charge implements Provider.
func (t tracedProvider) Charge(ctx context.Context, req provider.ChargeRequest) (provider.Charge, error) {
	ctx, span := telemetry.Start(ctx, "provider.charge", trace.SpanKindClient,
		attribute.Int64("idem.fencing_token", req.FencingToken))
	ch, err := t.p.Charge(ctx, req)
	endProviderSpan(span, err)
	return ch, err
}

// Lookup implements Provider.
func (t tracedProvider) Lookup(ctx context.Context, providerKey string) (provider.Charge, error) {
	ctx, span := telemetry.Start(ctx, "provider.lookup", trace.SpanKindClient)
	ch, err := t.p.Lookup(ctx, providerKey)
	endProviderSpan(span, err)
	return ch, err
}

// endProviderSpan ends a provider call's span. A decline or an unknown key
// is an answer, not a failure of the call.
func endProviderSpan(span trace.Span, err error) {
	switch {
	case err == nil:
	case errors.Is(err, provider.ErrDeclined):
		span.SetAttributes(attribute.String("idem.provider.answer", "declined"))
	case errors.Is(err, provider.ErrNotFound):
		span.SetAttributes(attribute.String("idem.provider.answer", "not_found"))
	default:
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem/internal/telemetry"
)

// queryTracer gives every statement a span, a child of the span in its
// context (see telemetry.Start): none when the caller is not traced.
type queryTracer struct{}

type querySpanKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (queryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx
	}
	op := statementVerb(data.SQL)
	ctx, span := telemetry.Start(ctx, "db "+op, trace.SpanKindClient,
		attribute.String("db.system.name", "postgresql"), attribute.String("db.operation.name", op))
	return context.WithValue(ctx, querySpanKey{}, span)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (queryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	span, ok := ctx.Value(querySpanKey{}).(trace.Span)
	if !ok {
		return
	}
	endSpan(span, data.Err)
}

// TraceBatchStart implements pgx.BatchTracer: a batch is one round trip
// and one span, named for its statements less the BEGIN and COMMIT that
// wrap a statement sent as a transaction of its own (serialConn) and the
// plan settings of a batch statement (batchPlan).
func (queryTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() || data.Batch == nil {
		return ctx
	}
	var verbs []string
	for _, q := range data.Batch.QueuedQueries {
		if v := statementVerb(q.SQL); v != "BEGIN" && v != "COMMIT" && q.SQL != batchPlan {
			verbs = append(verbs, v)
		}
	}
	op := strings.Join(verbs, "+")
	ctx, span := telemetry.Start(ctx, "db "+op, trace.SpanKindClient,
		attribute.String("db.system.name", "postgresql"), attribute.String("db.operation.name", op),
		attribute.Int("db.operation.batch.size", len(data.Batch.QueuedQueries)))
	return context.WithValue(ctx, querySpanKey{}, span)
}

// TraceBatchQuery implements pgx.BatchTracer.
func (queryTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (queryTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	span, ok := ctx.Value(querySpanKey{}).(trace.Span)
	if !ok {
		return
	}
	endSpan(span, data.Err)
}

// statementVerb returns the first word of a statement (SELECT, INSERT, ...):
// statements are the store's own text, the arguments are never recorded.
func statementVerb(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \t\n("); i > 0 {
		sql = sql[:i]
	}
	return strings.ToUpper(sql)
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

package telemetry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// RequestFields identify a request in its log lines. A request's fields are
// filled in as they become known (the node first, the tenant once
// authenticated, the operation and key hash once read), on the one value
// WithRequest put in the context; they are read only by the request's own
// goroutine.
type RequestFields struct {
	Region, Node string
	Tenant       string
	Operation    string
	// KeyHash is KeyHash(key): the key itself is never logged.
	KeyHash string
}

type fieldsKey struct{}

// WithRequest returns ctx carrying f, which LogHandler adds to every line
// logged with ctx.
func WithRequest(ctx context.Context, f *RequestFields) context.Context {
	return context.WithValue(ctx, fieldsKey{}, f)
}

// RequestOf returns the fields WithRequest put in ctx, or nil.
func RequestOf(ctx context.Context) *RequestFields {
	f, _ := ctx.Value(fieldsKey{}).(*RequestFields)
	return f
}

// KeyHash returns the first 16 hex digits of an idempotency key's SHA-256:
// enough to find one key's lines, and the key is never written to a log.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// requestKeys name the fields of RequestFields in log lines.
var requestKeys = [5]string{"region", "node", "tenant", "operation", "key_hash"}

// LogHandler adds to every record logged with a context the request's
// fields (region, node, tenant, operation, key_hash; those that are known)
// and its trace_id and span_id. Records logged without a request context
// pass through unchanged.
type LogHandler struct {
	inner slog.Handler
}

// NewLogHandler wraps h; a handler that is already a LogHandler is returned
// as it is.
func NewLogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(*LogHandler); ok {
		return h
	}
	return &LogHandler{inner: h}
}

// Enabled implements slog.Handler.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if f := RequestOf(ctx); f != nil {
		// A field the line already names itself (a tenant logged by the
		// payment service) is not repeated.
		var own [5]bool
		r.Attrs(func(a slog.Attr) bool {
			for i, k := range requestKeys {
				own[i] = own[i] || a.Key == k
			}
			return true
		})
		for i, v := range [...]string{f.Region, f.Node, f.Tenant, f.Operation, f.KeyHash} {
			if v != "" && !own[i] {
				r.AddAttrs(slog.String(requestKeys[i], v))
			}
		}
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h *LogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &LogHandler{inner: h.inner.WithAttrs(as)}
}

// WithGroup implements slog.Handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{inner: h.inner.WithGroup(name)}
}

// NewLogger returns a logger writing to w at level ("debug", "info",
// "warn" or "error") in format ("text" or "json"), through a LogHandler.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil || !validLevel(level) {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(NewLogHandler(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(NewLogHandler(slog.NewJSONHandler(w, opts))), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

func validLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

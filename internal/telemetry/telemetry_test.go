package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem/internal/telemetry"
)

// TestLogHandler: a line logged with a request's context carries the
// request's fields and its trace id; a line logged without one carries
// neither; attributes added with With stay.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	logger, err := telemetry.NewLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	f := &telemetry.RequestFields{Region: "eu-west", Node: "eu-west-0"}
	ctx := telemetry.WithRequest(context.Background(), f)
	f.Tenant, f.Operation, f.KeyHash = "tenant-a", "create_payment", telemetry.KeyHash("k")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	logger.With("component", "x").InfoContext(ctx, "in request")
	logger.Info("outside")
	logger.DebugContext(ctx, "below the level")
	logger.InfoContext(ctx, "names its tenant", "tenant", "tenant-a")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	var in, out map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &in)
	_ = json.Unmarshal([]byte(lines[1]), &out)
	for k, v := range map[string]string{"region": "eu-west", "node": "eu-west-0", "tenant": "tenant-a",
		"operation": "create_payment", "key_hash": telemetry.KeyHash("k"), "trace_id": tid.String(),
		"span_id": sid.String(), "component": "x"} {
		if in[k] != v {
			t.Errorf("in-request line: %s = %v, want %s", k, in[k], v)
		}
	}
	if n := strings.Count(lines[2], `"tenant"`); n != 1 {
		t.Errorf("a line naming its tenant has it %d times: %s", n, lines[2])
	}
	for _, k := range []string{"tenant", "trace_id", "region"} {
		if _, ok := out[k]; ok {
			t.Errorf("line without a request context has %s: %v", k, out)
		}
	}
}

func TestKeyHash(t *testing.T) {
	// printf %s abc | sha256sum | cut -c1-16
	if got, want := telemetry.KeyHash("abc"), "ba7816bf8f01cfea"; got != want {
		t.Errorf("KeyHash(abc) = %s, want %s", got, want)
	}
}

func TestNewLoggerRefuses(t *testing.T) {
	for _, c := range [][2]string{{"verbose", "text"}, {"info", "xml"}, {"", "json"}, {"INFO+2", "text"}} {
		if _, err := telemetry.NewLogger(&bytes.Buffer{}, c[0], c[1]); err == nil {
			t.Errorf("NewLogger(%q, %q) accepted", c[0], c[1])
		}
	}
}

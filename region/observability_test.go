package region_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// lockedBuffer is a log destination shared by a node's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON log lines written so far.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// tracedConfig is a node configuration that traces into its own in-memory
// exporter (each node is its own process in production) and logs JSON at
// debug level.
func tracedConfig(t *testing.T, secret []byte) (region.Config, *tracetest.InMemoryExporter, *lockedBuffer) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	logs := &lockedBuffer{}
	logger, err := telemetry.NewLogger(logs, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	return region.Config{PeerSecret: secret, TracerProvider: tp, Logger: logger, Registry: prometheus.NewRegistry()}, exp, logs
}

func spanNamed(spans tracetest.SpanStubs, name string) *tracetest.SpanStub {
	for i := range spans {
		if spans[i].Name == name {
			return &spans[i]
		}
	}
	return nil
}

// TestForwardedRequestIsOneTrace: a request sent to a node outside its
// tenant's home region, carrying the client's traceparent, is one trace
// across both nodes: the forwarder's server and forward spans, the home
// node's server span (a child of the forward span) and its claim, store
// write and statements. Every log line of the request, on both
// nodes, carries region, node, tenant, operation, the key's hash (never the
// key) and the trace id. Without a caller's traceparent the forwarder
// starts the trace and the home node joins it.
func TestForwardedRequestIsOneTrace(t *testing.T) {
	c := newFwdCluster(t, false)
	secret := []byte("s3cret-peer")
	euCfg, euSpans, euLogs := tracedConfig(t, secret)
	usCfg, usSpans, usLogs := tracedConfig(t, secret)
	c.start("eu-west", euCfg)
	us := c.start("us-east", usCfg)

	const (
		key         = "trace-me-key-4711"
		traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
		traceparent = "00-" + traceID + "-00f067aa0ba902b7-01"
	)
	a := c.send(us.url, key, map[string]string{"Traceparent": traceparent})
	if a.status != http.StatusCreated {
		t.Fatalf("forwarded payment: %d %s", a.status, a.body)
	}
	// Both server spans end once their handlers return, which may be just
	// after the client has its answer.
	waitUntil(t, "both nodes' server spans are exported", func() bool {
		return spanNamed(euSpans.GetSpans(), "POST /payments") != nil && spanNamed(usSpans.GetSpans(), "POST /payments") != nil
	})
	usServer, forward := spanNamed(usSpans.GetSpans(), "POST /payments"), spanNamed(usSpans.GetSpans(), "forward")
	euSpansNow := euSpans.GetSpans()
	euServer := spanNamed(euSpansNow, "POST /payments")
	if forward == nil {
		t.Fatal("the forwarder has no forward span")
	}
	for _, s := range append(usSpans.GetSpans(), euSpansNow...) {
		if got := s.SpanContext.TraceID().String(); got != traceID {
			t.Errorf("span %q on trace %s, want the client's %s", s.Name, got, traceID)
		}
	}
	if usServer.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("the forwarder's server span's parent is %s, want the client's span", usServer.Parent.SpanID())
	}
	if forward.Parent.SpanID() != usServer.SpanContext.SpanID() {
		t.Errorf("the forward span's parent is %s, want the server span %s", forward.Parent.SpanID(), usServer.SpanContext.SpanID())
	}
	if euServer.Parent.SpanID() != forward.SpanContext.SpanID() || !euServer.Parent.IsRemote() {
		t.Errorf("the home node's server span's parent is %s (remote %v), want the forward span %s",
			euServer.Parent.SpanID(), euServer.Parent.IsRemote(), forward.SpanContext.SpanID())
	}
	// A fresh key's claim is one statement, sent as an implicit
	// transaction (store.exec); a node that has seen no retries claims
	// first, with no read before it (payments.ClaimAdaptive).
	for _, name := range []string{"idem.claim", "store.exec", "db WITH"} {
		if spanNamed(euSpansNow, name) == nil {
			t.Errorf("the home node has no %q span", name)
		}
	}
	if spanNamed(euSpansNow, "db SELECT") != nil {
		t.Error(`the home node read before its claim ("db SELECT"); a node with no retries claims first`)
	}

	want := map[string]string{"tenant": "tenant-a", "operation": "create_payment",
		"key_hash": telemetry.KeyHash(key), "trace_id": traceID}
	for name, logs := range map[string]*lockedBuffer{"us-east": usLogs, "eu-west": euLogs} {
		lines := logs.lines(t)
		seen := false
		for _, l := range lines {
			if l["trace_id"] == nil {
				continue
			}
			seen = true
			for k, v := range want {
				if l[k] != v {
					t.Errorf("%s: log line %v: %s = %v, want %s", name, l, k, l[k], v)
				}
			}
			if l["region"] != name || l["node"] != name+"-0" {
				t.Errorf("%s: log line %v: region/node %v/%v", name, l, l["region"], l["node"])
			}
		}
		if !seen {
			t.Errorf("%s logged no line of the request: %v", name, lines)
		}
	}
	for _, logs := range []*lockedBuffer{usLogs, euLogs} {
		logs.mu.Lock()
		if strings.Contains(logs.b.String(), key) {
			t.Errorf("a log holds the idempotency key itself:\n%s", logs.b.String())
		}
		logs.mu.Unlock()
	}

	// Without a caller's trace context the forwarder starts the trace and
	// the home node still joins it.
	euSpans.Reset()
	usSpans.Reset()
	// The same body under another key: a 409 duplicate, answered by the
	// home node all the same.
	if a := c.send(us.url, key+"-2", nil); a.status >= 500 {
		t.Fatalf("second forwarded payment: %d %s", a.status, a.body)
	}
	waitUntil(t, "both nodes' server spans are exported", func() bool {
		return spanNamed(euSpans.GetSpans(), "POST /payments") != nil && spanNamed(usSpans.GetSpans(), "POST /payments") != nil
	})
	root := spanNamed(usSpans.GetSpans(), "POST /payments")
	if root.Parent.IsValid() {
		t.Errorf("the forwarder's server span has a parent %s without a caller's traceparent", root.Parent.SpanID())
	}
	for _, s := range append(usSpans.GetSpans(), euSpans.GetSpans()...) {
		if s.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Errorf("span %q on trace %s, want the forwarder's %s", s.Name, s.SpanContext.TraceID(), root.SpanContext.TraceID())
		}
	}
}

// TestStandardMetrics: a node's /metrics carries the Go runtime's and the
// process's series, the build information and the store pool's statistics.
func TestStandardMetrics(t *testing.T) {
	st, _ := storetest.New(t)
	n := newNodeOn(t, st, 0)
	resp, err := http.Get(n.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total",
		"process_resident_memory_bytes", `idem_build_info{goversion="go`, "idem_pgxpool_acquired_conns",
		"idem_pgxpool_idle_conns", "idem_pgxpool_total_conns", "idem_pgxpool_acquire_total",
		"idem_pgxpool_acquire_wait_seconds_total", "idem_pgxpool_canceled_acquire_total"} {
		if !strings.Contains(string(b), "\n"+name) {
			t.Errorf("/metrics has no %s", name)
		}
	}
}

// TestRequestLogEchoesNoClientInput: the debug line of an unauthenticated
// request with a made-up method and path names neither.
func TestRequestLogEchoesNoClientInput(t *testing.T) {
	logs := &lockedBuffer{}
	logger, err := telemetry.NewLogger(logs, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := storetest.New(t)
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test"}), region.Config{Logger: logger})
	a := n.do("EVILMETHOD", "/evil-path-x", "", nil, "")
	if a.status != http.StatusNotFound && a.status != http.StatusMethodNotAllowed {
		t.Fatalf("status %d", a.status)
	}
	lines := logs.lines(t)
	if len(lines) == 0 {
		t.Fatal("no request line")
	}
	for _, l := range lines {
		b, _ := json.Marshal(l)
		if strings.Contains(string(b), "EVILMETHOD") || strings.Contains(string(b), "evil-path-x") {
			t.Errorf("log line echoes the request: %s", b)
		}
	}
}

package routing_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/routing"
)

// TestMapWatchSurvivesASilentMember: the member a Map's watch runs on goes
// silent (a proxy drops every byte and closes nothing, as a partition
// does; the client has no gRPC keepalive at all), and the Map still learns
// of a placement written afterwards, through another endpoint, because its
// probe finds the watch silent and opens it again. Without the probe the
// watch would wait for TCP to give up (minutes).
func TestMapWatchSurvivesASilentMember(t *testing.T) {
	srv := etcdtest.Start(t)
	direct := srv.Endpoints[0]
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(tp, "silent->etcd", "127.0.0.1:0", strings.TrimPrefix(direct, "http://"))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)

	// The Map's watch opens on the proxy (the only endpoint then); the
	// direct endpoint is added afterwards.
	cfg := srv.Config()
	cfg.Endpoints = []string{"http://" + p.Listen}
	cli := etcdtest.NewClient(t, cfg)
	m, err := routing.NewMap(ctxFor(t), cli, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	cli.SetEndpoints("http://"+p.Listen, direct)

	// Timeout 0: every byte is dropped, nothing is closed.
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"silence","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Toxics.RemoveToxic(t.Context(), "silence") })

	writer := srv.Client(t)
	placed, err := routing.SetPlacement(ctxFor(t), writer, "tenant-x", "ap-south")
	if err != nil {
		t.Fatal(err)
	}
	// A correctness bound, not a timing one: without the probe the watch
	// never delivers while the proxy is silent.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := m.WaitRevision(ctx, placed.Epoch); err != nil {
		t.Fatalf("the map never saw revision %d after its member went silent: %v", placed.Epoch, err)
	}
	if got, ok := m.Placement("tenant-x"); !ok || got.Region != "ap-south" {
		t.Errorf("placement of tenant-x = %+v (%v), want ap-south", got, ok)
	}
}

// TestMapSteersAwayFromASilentMember: when its watch goes silent, a Map
// takes the endpoints that do not answer out of its client before it opens
// the watch again, so the watch opens on a member that answers the first
// time (gRPC would otherwise balance it back onto the silent connection in
// turn, and the Map would learn of a move one WatchStaleAfter later for
// each time it did); once the member answers again the client gets it back.
func TestMapSteersAwayFromASilentMember(t *testing.T) {
	srv := etcdtest.Start(t)
	direct := srv.Endpoints[0]
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(tp, "steer->etcd", "127.0.0.1:0", strings.TrimPrefix(direct, "http://"))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	silentEP := "http://" + p.Listen

	cfg := srv.Config()
	cfg.Endpoints = []string{silentEP}
	cli := etcdtest.NewClient(t, cfg)
	logs := &countingHandler{}
	m, err := routing.NewMap(ctxFor(t), cli, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	cli.SetEndpoints(silentEP, direct)

	if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"silence","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
	writer := srv.Client(t)
	placed, err := routing.SetPlacement(ctxFor(t), writer, "tenant-x", "ap-south")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := m.WaitRevision(ctx, placed.Epoch); err != nil {
		t.Fatalf("the map never saw revision %d after its member went silent: %v", placed.Epoch, err)
	}
	if n := logs.count("routing watch silent"); n != 1 {
		t.Errorf("the watch was found silent %d times before the map saw the placement, want 1 (opened again on the silent member)", n)
	}
	if got := cli.Endpoints(); !slices.Equal(got, []string{direct}) {
		t.Errorf("client endpoints while the proxy is silent = %v, want only %s", got, direct)
	}

	if err := p.Toxics.RemoveToxic(t.Context(), "silence"); err != nil {
		t.Fatal(err)
	}
	for !slices.Contains(cli.Endpoints(), silentEP) {
		select {
		case <-ctx.Done():
			t.Fatalf("the client never got %s back once it answered again: endpoints %v", silentEP, cli.Endpoints())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if logs.count("etcd endpoints answer again") != 1 {
		t.Errorf("rejoin not logged once: %d", logs.count("etcd endpoints answer again"))
	}
}

// countingHandler is a slog handler that counts messages.
type countingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// count is how many messages began with prefix.
func (h *countingHandler) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

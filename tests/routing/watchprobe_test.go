package routing_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
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

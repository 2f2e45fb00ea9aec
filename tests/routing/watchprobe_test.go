package routing_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/logtest"
	"github.com/idemcoord/idem/routing"
)

// TestMapWatchSurvivesASilentMember: the member a Map's watch runs on goes
// silent (a proxy drops every byte and closes nothing, as a partition
// does; the client has no gRPC keepalive at all), and the Map still learns
// of a placement written afterwards, through another endpoint, because its
// probe finds the watch silent and opens it again. Without the probe the
// watch would wait for TCP to give up (minutes).
func TestMapWatchSurvivesASilentMember(t *testing.T) {
	ms := newSilentMember(t, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	srv, m := ms.srv, ms.m

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
	logs := &logtest.Messages{}
	ms := newSilentMember(t, slog.New(logs))
	srv, m, cli, direct, silentEP := ms.srv, ms.m, ms.cli, ms.direct, ms.silent

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
	if n := logs.Count("routing watch silent"); n != 1 {
		t.Errorf("the watch was found silent %d times before the map saw the placement, want 1 (opened again on the silent member)", n)
	}
	if got := cli.Endpoints(); !slices.Equal(got, []string{direct}) {
		t.Errorf("client endpoints while the proxy is silent = %v, want only %s", got, direct)
	}

	if err := ms.p.Toxics.RemoveToxic(t.Context(), "silence"); err != nil {
		t.Fatal(err)
	}
	for !slices.Contains(cli.Endpoints(), silentEP) {
		select {
		case <-ctx.Done():
			t.Fatalf("the client never got %s back once it answered again: endpoints %v", silentEP, cli.Endpoints())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if logs.Count("etcd endpoints answer again") != 1 {
		t.Errorf("rejoin not logged once: %d", logs.Count("etcd endpoints answer again"))
	}
}

// silentMember is a Map whose watch runs on a toxiproxy in front of a
// one-member etcd (the client's only endpoint while the Map starts; the
// member's own endpoint is added afterwards), and the proxy then silenced:
// every byte dropped, nothing closed, as a partition does.
type silentMember struct {
	srv            *etcdtest.Server
	cli            *clientv3.Client
	m              *routing.Map
	p              *toxiproxy.Proxy
	direct, silent string
}

func newSilentMember(t *testing.T, logger *slog.Logger) *silentMember {
	t.Helper()
	ms := &silentMember{srv: etcdtest.Start(t)}
	ms.direct = ms.srv.Endpoints[0]
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	ms.p = toxiproxy.NewProxy(tp, "silent->etcd", "127.0.0.1:0", strings.TrimPrefix(ms.direct, "http://"))
	if err := ms.p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ms.p.Stop)
	ms.silent = "http://" + ms.p.Listen
	cfg := ms.srv.Config()
	cfg.Endpoints = []string{ms.silent}
	ms.cli = etcdtest.NewClient(t, cfg)
	var err error
	if ms.m, err = routing.NewMap(ctxFor(t), ms.cli, logger); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ms.m.Close)
	ms.cli.SetEndpoints(ms.silent, ms.direct)
	// Timeout 0: every byte is dropped, nothing is closed.
	if _, err := ms.p.Toxics.AddToxicJson(strings.NewReader(`{"name":"silence","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.p.Toxics.RemoveToxic(context.Background(), "silence") })
	return ms
}

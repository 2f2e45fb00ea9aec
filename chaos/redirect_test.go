package chaos

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestCallGoesOnToALiveRegion: a call meant for a region whose nodes
// refuse connections (dead processes) goes on to a live region's node, as
// a client with several endpoints does, and is recorded once, where it
// was answered, naming the node it was meant for.
func TestCallGoesOnToALiveRegion(t *testing.T) {
	var dead []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, "http://"+l.Addr().String())
		l.Close() // nothing listens there any more: connections are refused
	}
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"paymentId":"pay_1"}`))
	}))
	defer live.Close()
	targets := map[string][]target{
		"eu-west": {{region: "eu-west", node: "eu-west-0", url: dead[0]}, {region: "eu-west", node: "eu-west-1", url: dead[1]}},
		"us-east": {{region: "us-east", node: "us-east-0", url: live.URL}},
	}
	hist := &History{}
	w := newWorkload(WorkloadConfig{}, 1, "r", []string{"eu-west", "us-east"}, targets,
		map[string]string{"tenant-a": "tok"}, map[string]string{"tenant-a": "eu-west"}, hist, time.Now())
	cmd := Command{AccountID: "acc_1", AmountMinor: 1000, Currency: "EUR", MerchantReference: "ref", Channel: "web"}
	rng := rand.New(rand.NewPCG(1, 2))
	op := w.call(context.Background(), &http.Client{Timeout: 2 * time.Second},
		callSpec{client: 0, role: RoleNormal, tenant: "tenant-a", key: "k", cmd: cmd, attempt: 1, region: "eu-west", node: 0},
		rng, cmd.Serialise(1, rng))
	if op.Status != http.StatusCreated || op.Node != "us-east-0" || op.Region != "us-east" || op.RedirectedFrom != "eu-west-0" {
		t.Errorf("op = status %d at %s (%s), redirected from %q; want 201 at us-east-0, from eu-west-0", op.Status, op.Node, op.Region, op.RedirectedFrom)
	}
	if ops := hist.Ops(); len(ops) != 1 {
		t.Errorf("%d ops recorded; want 1", len(ops))
	}
}

package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/cluster"
)

// TestDockerEnvironment runs a two-region cluster in containers, each
// region on its own network, and checks what the network layer does: a
// payment forwarded across the WAN, an isolated region that stops serving
// and comes back consistent, and a one-way cut where the region reaches
// nobody while the others still reach it.
func TestDockerEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := cluster.DockerAvailable(ctx); err != nil {
		t.Skipf("docker environment unavailable: %v", err)
	}
	c := startCluster(t, cluster.Config{
		Regions:        []string{"eu-west", "us-east"},
		NodesPerRegion: 1,
		EtcdMembers:    3,
		Provider:       true,
		Docker:         true,
		RegionLeaseTTL: 3 * time.Second,
	})
	if !c.Docker() {
		t.Fatal("Docker() is false")
	}
	info := c.Info()
	eu, us := c.Node("eu-west", 0), c.Node("us-east", 0)
	if eu.Container() == "" || us.Container() == "" {
		t.Fatalf("nodes not in containers: %q %q", eu.Container(), us.Container())
	}
	if home := c.HomeRegion("tenant-a"); home != "eu-west" {
		t.Fatalf("tenant-a's home is %s, want eu-west", home)
	}
	tokenA := info.Tokens["tenant-a"]

	// Served across the WAN: us-east forwards tenant-a's request home.
	first := postUntilServed(ctx, t, us.URL(), tokenA, "docker-1", "ref-docker-1")
	if first.status != http.StatusCreated {
		t.Fatalf("forwarded payment: %d %s", first.status, first.body)
	}

	// Isolated: eu-west loses etcd, the store and the provider at once; its
	// node stops serving once its region lease has lapsed.
	if err := c.IsolateRegion(ctx, "eu-west"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		r := tryPost(eu.URL(), tokenA, "docker-2", "ref-docker-2")
		if r.status != 0 && r.status < 500 {
			return fmt.Errorf("isolated eu-west still answers %d %s", r.status, r.body)
		}
		return nil
	})
	if r := tryPost(us.URL(), tokenA, "docker-2", "ref-docker-2"); r.status != 0 && r.status < 500 {
		t.Errorf("us-east answered %d for a tenant of the isolated region: %s", r.status, r.body)
	}
	if err := c.RejoinRegion(ctx, "eu-west"); err != nil {
		t.Fatal(err)
	}
	again := postUntilServed(ctx, t, us.URL(), tokenA, "docker-1", "ref-docker-1")
	if again.status != first.status || string(again.body) != string(first.body) {
		t.Errorf("replay after the partition: %d %s, want %d %s", again.status, again.body, first.status, first.body)
	}

	// One way: eu-west opens no connection through the WAN, while us-east
	// still opens connections into eu-west (its node's ingress link).
	if err := c.CutOutbound(ctx, "eu-west", true); err != nil {
		t.Fatal(err)
	}
	euIngress, usIngress := ingressPort(t, c, eu.Name()), ingressPort(t, c, us.Name())
	if err := dialFrom(ctx, us.Container(), usIngress); err != nil {
		t.Errorf("us-east cannot reach its own ingress link: %v", err)
	}
	if err := dialFrom(ctx, us.Container(), euIngress); err != nil {
		t.Errorf("us-east cannot reach eu-west during the one-way cut: %v", err)
	}
	if err := dialFrom(ctx, eu.Container(), usIngress); err == nil {
		t.Error("eu-west reached us-east during the one-way cut")
	}
	if err := c.CutOutbound(ctx, "eu-west", false); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(ctx, eu.Container(), usIngress); err != nil {
		t.Errorf("eu-west cannot reach us-east once the cut is undone: %v", err)
	}
	if err := c.IsolateRegion(ctx, "nowhere"); err == nil {
		t.Error("IsolateRegion of an unknown region succeeded")
	}
}

// tryPost posts a payment with a 5-second timeout; status 0 means no
// answer came (a silent partition may hold a request until then).
func tryPost(baseURL, token, key, ref string) response {
	req, err := http.NewRequest(http.MethodPost, baseURL+"/payments", strings.NewReader(paymentBody(ref)))
	if err != nil {
		return response{}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return response{}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, body: body}
}

// ingressPort returns the WAN port of node's ingress link.
func ingressPort(tb testing.TB, c *cluster.Cluster, node string) string {
	tb.Helper()
	for _, l := range c.Links() {
		if l.Name == "->"+node {
			return l.Listen[strings.LastIndexByte(l.Listen, ':')+1:]
		}
	}
	tb.Fatalf("no ingress link of %s", node)
	return ""
}

// dialFrom opens a TCP connection from inside container to wan:port (the
// image's bash and coreutils), giving up after 3 seconds.
func dialFrom(ctx context.Context, container, port string) error {
	out, err := exec.CommandContext(ctx, "docker", "exec", container, "timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/wan/"+port).CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(string(out)))
		}
		return err
	}
	return nil
}

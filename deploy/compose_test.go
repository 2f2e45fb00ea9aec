package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/internal/images"
)

// TestComposePostgresProfile brings the compose file's postgres profile up
// with docker-compose (the images of `idemctl images build`, nothing
// pulled), sends a payment through eu-west, retries it through us-east
// (forwarded to the tenant's home and replayed byte for byte), and brings it
// down with its volumes.
func TestComposePostgresProfile(t *testing.T) {
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose not installed (Debian: apt-get install docker-compose)")
	}
	root, err := images.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	tags, err := images.Tags(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{tags.Idem, tags.Postgres, tags.Debian} {
		if out, err := exec.Command("docker", "image", "inspect", "--format", "{{.Id}}", img).CombinedOutput(); err != nil {
			t.Skipf("image %s is not in the Docker engine (go run ./cmd/idemctl images build): %s", img, bytes.TrimSpace(out))
		}
	}
	ctx := t.Context()
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	project := "idemtest" + hex.EncodeToString(suffix)
	env := append(os.Environ(),
		"IDEMD_IMAGE="+tags.Idem, "POSTGRES_IMAGE="+tags.Postgres, "DEBIAN_IMAGE="+tags.Debian,
		"CLUSTER_PEER_SECRET=", "IDEM_AUTH_TOKENS=tok-compose-a=tenant-a")
	ports := map[string]string{}
	for _, name := range []string{"EU_WEST", "US_EAST", "AP_SOUTH", "PROVIDER", "ETCD"} {
		ports[name] = freePort(t)
		env = append(env, "HOST_PORT_"+name+"="+ports[name])
	}
	file := filepath.Join(root, "deploy/compose/docker-compose.yml")
	run := func(ctx context.Context, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, compose, append([]string{"-p", project, "-f", file, "--profile", "postgres"}, args...)...)
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if t.Failed() {
			out, _ := run(ctx, "logs", "--no-color", "--tail", "60")
			t.Logf("docker-compose logs:\n%s", out)
		}
		if out, err := run(ctx, "down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("docker-compose down: %v\n%s", err, out)
		}
	})
	// up returns once the nodes' dependencies are healthy and the nodes
	// started; the nodes' own health is awaited below.
	if out, err := run(ctx, "up", "-d"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	eu := "http://127.0.0.1:" + ports["EU_WEST"]
	us := "http://127.0.0.1:" + ports["US_EAST"]
	for _, u := range []string{eu, us, "http://127.0.0.1:" + ports["AP_SOUTH"]} {
		waitReady(ctx, t, u+"/readyz")
	}

	first := post(ctx, t, eu, "tok-compose-a", "compose-1")
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("POST through eu-west: %d (replayed %v) %s, want a fresh 201", first.status, first.replayed, first.body)
	}
	again := post(ctx, t, us, "tok-compose-a", "compose-1")
	if again.status != http.StatusCreated || !again.replayed || !bytes.Equal(again.body, first.body) {
		t.Errorf("retry through us-east: %d (replayed %v)\n%s\nwant the first answer replayed byte for byte:\n%s", again.status, again.replayed, again.body, first.body)
	}
	// The record is in eu-west's database only (tenant-a was placed there
	// by its first request).
	for db, want := range map[string]string{"idem_eu_west": "1", "idem_us_east": "0"} {
		out, err := run(ctx, "exec", "-T", "store", "psql", "-U", "postgres", "-d", db, "-Atc",
			"SELECT count(*) FROM idempotency_records WHERE tenant_id = 'tenant-a' AND idempotency_key = 'compose-1'")
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("%s holds %q record(s) (%v), want %s", db, bytes.TrimSpace(out), err, want)
		}
	}
}

type answer struct {
	status   int
	replayed bool
	body     []byte
}

func post(ctx context.Context, t *testing.T, base, token, key string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments",
		strings.NewReader(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-compose"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s/payments: %v", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", b}
}

// waitReady polls url until it answers 200 (the node serves and its store
// answers), or the test's context ends.
func waitReady(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never ready: %s", url, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

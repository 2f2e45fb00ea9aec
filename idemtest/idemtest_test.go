package idemtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/idemcoord/idem/idemtest"
	"github.com/idemcoord/idem/internal/containertest"
	"github.com/idemcoord/idem/internal/images"
)

func TestMain(m *testing.M) {
	containertest.Setup()
	os.Exit(m.Run())
}

// requireImages returns the images built from this tree (their content
// tags), or skips the test in one line naming what is missing.
func requireImages(t *testing.T) images.Set {
	t.Helper()
	root, err := images.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	tags, err := images.Tags(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := idemtest.Available(t.Context(), tags.Idem, tags.Postgres); err != nil {
		t.Skip(err)
	}
	return tags
}

// TestImagesAnswer starts each image on its own: PostgreSQL accepts a
// password connection and is version 15; the idem image's etcd answers
// /health and its etcdctl, idemd and idemctl run.
func TestImagesAnswer(t *testing.T) {
	tags := requireImages(t)
	ctx := t.Context()

	pg, err := testcontainers.Run(ctx, tags.Postgres,
		testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": "pw-for-a-test", "POSTGRES_DATABASES": "one two"}),
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections")))
	testcontainers.CleanupContainer(t, pg)
	if err != nil {
		t.Fatal(err)
	}
	hostPort, err := pg.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, "postgres://postgres:pw-for-a-test@"+hostPort+"/two?sslmode=disable")
	if err != nil {
		t.Fatalf("connect to the PostgreSQL image: %v", err)
	}
	defer conn.Close(context.Background())
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil || !strings.HasPrefix(version, "15.") {
		t.Errorf("server_version %q (%v), want 15.x", version, err)
	}
	if _, err := pgx.Connect(ctx, "postgres://postgres:wrong@"+hostPort+"/two?sslmode=disable"); err == nil {
		t.Error("a wrong password connected")
	}

	etcd, err := testcontainers.Run(ctx, tags.Idem,
		testcontainers.WithEntrypoint("/usr/local/bin/etcd"),
		testcontainers.WithCmd("--data-dir", "/var/lib/etcd/data", "--listen-client-urls", "http://0.0.0.0:2379",
			"--advertise-client-urls", "http://127.0.0.1:2379"),
		testcontainers.WithExposedPorts("2379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForHTTP("/health").WithPort("2379/tcp")))
	testcontainers.CleanupContainer(t, etcd)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"/usr/local/bin/etcdctl", "--endpoints", "http://127.0.0.1:2379", "put", "k", "v"},
		{"/usr/local/bin/idemd", "--help"},
		{"/usr/local/bin/idemctl", "help"},
	} {
		code, out, err := etcd.Exec(ctx, cmd)
		b, _ := io.ReadAll(out)
		if err != nil || code != 0 {
			t.Errorf("%s in the idem image: exit %d, %v: %s", cmd, code, err, b)
		}
	}
	// The image's idemctl is the operator build: its commands, none of the
	// tooling's (the chaos harness, the local cluster, the benchmarks).
	code, out, err := etcd.Exec(ctx, []string{"/usr/local/bin/idemctl", "help"})
	b, _ := io.ReadAll(out)
	if err != nil || code != 0 || !strings.Contains(string(b), "migrate") || !strings.Contains(string(b), "region") {
		t.Errorf("idemctl help in the idem image: exit %d, %v, without migrate or region: %s", code, err, b)
	}
	for _, tooling := range []string{"chaos", "soak", "bench", "up"} {
		if code, _, err := etcd.Exec(ctx, []string{"/usr/local/bin/idemctl", tooling, "-h"}); err != nil || code != 2 {
			t.Errorf("idemctl %s in the idem image: exit %d, %v; want 2 (an unknown command in the operator build)", tooling, code, err)
		}
	}
}

// TestMultiRegionContainers is cluster's TestMultiRegion run as
// containers: a payment sent to the tenant's other region is forwarded
// home, stored there only, and answered byte for byte as a replay from
// either region; the same key with another command is refused.
func TestMultiRegionContainers(t *testing.T) {
	tags := requireImages(t)
	ctx := t.Context()
	c, err := idemtest.Run(ctx,
		idemtest.WithImages(tags.Idem, tags.Postgres),
		idemtest.WithRegions("eu-west", "us-east"),
		idemtest.WithNodesPerRegion(2),
		idemtest.WithTestLogger(t))
	idemtest.Cleanup(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Homes["tenant-a"] != "eu-west" || c.Homes["tenant-b"] != "us-east" {
		t.Fatalf("homes %v", c.Homes)
	}
	home, away := c.Region("eu-west"), c.Region("us-east")
	if len(home.Nodes) != 2 || len(away.Nodes) != 2 {
		t.Fatalf("nodes: %d in eu-west, %d in us-east; want 2 each", len(home.Nodes), len(away.Nodes))
	}
	token := c.Tokens["tenant-a"]

	fwd := postPayment(t, away.Nodes[1].URL, token, "fwd-1", "10.00")
	if fwd.status != http.StatusCreated || fwd.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("POST to the non-home region: %d (replayed %q) %s, want a fresh 201", fwd.status, fwd.header.Get("Idempotent-Replayed"), fwd.body)
	}
	for _, n := range append(home.Nodes, away.Nodes...) {
		r := postPayment(t, n.URL, token, "fwd-1", "10.00")
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, fwd.body) {
			t.Errorf("replay through %s: %d, Idempotent-Replayed %q:\n%s\nwant the first answer byte for byte:\n%s", n.Name, r.status, r.header.Get("Idempotent-Replayed"), r.body, fwd.body)
		}
	}
	if r := postPayment(t, c.URL("eu-west"), token, "fwd-1", "100.00"); r.status != http.StatusConflict || !bytes.Contains(r.body, []byte("IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST")) {
		t.Errorf("same key, another amount: %d %s, want 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST", r.status, r.body)
	}

	// The payment lives in the home region's database only.
	for _, r := range c.Regions {
		want := 0
		if r.Name == "eu-west" {
			want = 1
		}
		records := countRows(ctx, t, r.DatabaseURL, `SELECT count(*) FROM idempotency_records WHERE tenant_id = 'tenant-a' AND idempotency_key = 'fwd-1'`)
		payments := countRows(ctx, t, r.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-a'`)
		if records != want || payments != want {
			t.Errorf("region %s: %d record(s), %d payment(s); want %d of each", r.Name, records, payments, want)
		}
	}

	// tenant-b lives in us-east: the other way round.
	if r := postPayment(t, c.URL("eu-west"), c.Tokens["tenant-b"], "fwd-2", "20.00"); r.status != http.StatusCreated {
		t.Errorf("POST for tenant-b to eu-west: %d %s", r.status, r.body)
	}
	if n := countRows(ctx, t, away.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-b'`); n != 1 {
		t.Errorf("us-east has %d payment(s) of tenant-b, want 1", n)
	}
	if n := countRows(ctx, t, home.DatabaseURL, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-b'`); n != 0 {
		t.Errorf("eu-west has %d payment(s) of tenant-b, want 0", n)
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func postPayment(tb testing.TB, baseURL, token, key, amount string) response {
	tb.Helper()
	body := fmt.Sprintf(`{"accountId":"acc_1","amount":%q,"currency":"EUR","merchantReference":"invoice-%s"}`, amount, key)
	req, err := http.NewRequest(http.MethodPost, baseURL+"/payments", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s/payments: %v", baseURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func countRows(ctx context.Context, tb testing.TB, dbURL, query string) int {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, query).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestAvailableMissingImage: an image the engine does not have (or no
// engine at all) makes Available fail with ErrUnavailable, the error tests
// skip with.
func TestAvailableMissingImage(t *testing.T) {
	err := idemtest.Available(t.Context(), "idem/no-such-image:0")
	if !errors.Is(err, idemtest.ErrUnavailable) {
		t.Fatalf("Available(a missing image) = %v, want ErrUnavailable", err)
	}
	t.Log(err)
}

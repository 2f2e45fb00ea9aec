package cluster_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/procfs"
)

// TestPgBouncer runs a node behind PgBouncer in transaction pooling: the
// database URLs are PgBouncer's, a payment and its replay are served
// through it, a node whose PgBouncer is killed answers 503 (never 500),
// and once it is restarted on the same port the node serves again and
// the payment still replays byte for byte.
func TestPgBouncer(t *testing.T) {
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		if _, err := exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			t.Skip(`pgbouncer is not installed (Debian package "pgbouncer")`)
		}
	}
	dir := stateDir(t)
	c := startCluster(t, cluster.Config{StateDir: dir, Regions: []string{"eu-west"}, PgBouncer: true})
	info := c.Info()
	b := info.PgBouncer
	if b == nil || c.PgBouncer() == nil {
		t.Fatal("Info and Cluster name no PgBouncer")
	}
	if b.Pid != c.PgBouncer().Pid() || !procfs.Alive(b.Pid) || b.PoolMode != "transaction" {
		t.Errorf("pgbouncer %+v: want the running PgBouncer in transaction pooling", b)
	}
	u, err := url.Parse(info.DatabaseURL)
	if err != nil || u.Host != b.Addr || u.Path != "/idem_eu_west" || u.Query().Get("default_query_exec_mode") != "exec" {
		t.Errorf("databaseUrl %s: want idem_eu_west through PgBouncer (%s), default_query_exec_mode=exec", info.DatabaseURL, b.Addr)
	}
	if b.Log != filepath.Join(dir, "logs", cluster.PgBouncerLog) {
		t.Errorf("log %s, want it with the cluster's logs", b.Log)
	}
	if log, err := os.ReadFile(b.Log); err != nil || len(log) == 0 {
		t.Errorf("PgBouncer's log: %v, %d bytes", err, len(log))
	}

	node, token := c.Node("eu-west", 0), info.Tokens["tenant-a"]
	created := postPayment(t, node.URL(), token, "abc-123", "invoice-7781")
	if created.status != http.StatusCreated {
		t.Fatalf("POST through PgBouncer: %d %s", created.status, created.body)
	}
	if r := postPayment(t, node.URL(), token, "abc-123", "invoice-7781"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay through PgBouncer: %d, Idempotent-Replayed %q: %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}

	pid := c.PgBouncer().Pid()
	c.PgBouncer().Kill()
	if procfs.Alive(pid) {
		t.Fatalf("PgBouncer (pid %d) runs after Kill", pid)
	}
	if r := postPayment(t, node.URL(), token, "key-during-kill", "invoice-kill"); r.status != http.StatusServiceUnavailable {
		t.Errorf("POST while PgBouncer is down: %d %s, want 503", r.status, bytes.TrimSpace(r.body))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.PgBouncer().Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.PgBouncer().Pid() == pid || strconv.Itoa(c.PgBouncer().Port()) != u.Port() {
		t.Errorf("after Restart: pid %d (was %d), port %d (was %s)", c.PgBouncer().Pid(), pid, c.PgBouncer().Port(), u.Port())
	}
	if r := postUntilServed(ctx, t, node.URL(), token, "abc-124", "invoice-7782"); r.status != http.StatusCreated {
		t.Errorf("POST after the restart: %d %s", r.status, r.body)
	}
	r := postUntilServed(ctx, t, node.URL(), token, "abc-123", "invoice-7781")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, created.body) {
		t.Errorf("replay after the restart: %d, Idempotent-Replayed %q: %s, want the original %s", r.status, r.header.Get("Idempotent-Replayed"), r.body, created.body)
	}

	pids := append(clusterPids(t, c), c.PgBouncer().Pid())
	stopCluster(t, c)
	assertGone(t, pids)
	assertNoChildren(t)
}

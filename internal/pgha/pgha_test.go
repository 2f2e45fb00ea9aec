package pgha_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgha"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/testbin"
	"github.com/idemcoord/idem/store"
)

// startStore starts etcd and a three-member store, or skips the test when
// Patroni or PostgreSQL is not installed.
func startStore(t *testing.T) *pgha.Cluster {
	t.Helper()
	if _, err := exec.LookPath("patroni"); err != nil {
		t.Skip(`patroni is not installed (Debian package "patroni")`)
	}
	if _, err := pgserver.FindBinDir(); err != nil {
		t.Skip(err.Error())
	}
	hosts := []string{startEtcd(t)}
	c, err := pgha.Start(t.Context(), pgha.Options{
		Members: []pgha.MemberSpec{
			{Name: "eu-west", Region: "eu-west"},
			{Name: "us-east", Region: "us-east"},
			{Name: "ap-south", Region: "ap-south"},
		},
		EtcdHosts: hosts,
		Database:  "idem_test",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range c.Members() {
				t.Logf("member %s: log %s", m.Name, m.LogPath())
			}
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

// TestPrimaryLoss writes through the multi-host URL while the primary (its
// agent and its server) is killed: a standby is promoted, every
// acknowledged write is on it, and the same store pool writes again
// without being reopened.
func TestPrimaryLoss(t *testing.T) {
	c := startStore(t)
	ctx := t.Context()
	st, err := store.Open(ctx, c.URL("idem_test"), store.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Pool().Exec(ctx, "CREATE TABLE acks (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	status, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	syncStandby := map[string]bool{}
	for _, m := range status {
		if m.Role == pgha.RoleSyncStandby {
			syncStandby[m.Name] = true
		}
	}

	// Two writers insert increasing ids; an id is acknowledged when its
	// commit returned nil. Writes keep going through the failover until
	// each writer has had 20 acknowledged writes after the new leader
	// showed up.
	var (
		mu       sync.Mutex
		acked    []int64
		promoted = make(chan struct{})
		wg       sync.WaitGroup
	)
	for w := range 2 {
		wg.Go(func() {
			after := 0
			for i := int64(w); after < 20; i += 2 {
				err := st.ExecTx(ctx, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "INSERT INTO acks (id) VALUES ($1) ON CONFLICT DO NOTHING", i)
					return err
				})
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					continue // unacknowledged: may or may not be there
				}
				mu.Lock()
				acked = append(acked, i)
				mu.Unlock()
				select {
				case <-promoted:
					after++
				default:
				}
			}
		})
	}
	for len(snapshot(&mu, &acked)) < 50 {
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	if err := old.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	var leader *pgha.Member
	for leader == nil || leader == old {
		leader, err = c.Leader(ctx)
		if err != nil && !errors.Is(err, pgha.ErrNoLeader) {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	close(promoted)
	wg.Wait()
	if !syncStandby[leader.Name] {
		t.Errorf("promoted %s, which was not the synchronous standby (%v)", leader.Name, syncStandby)
	}

	// Every acknowledged id is on the new primary.
	ids := snapshot(&mu, &acked)
	missing, err := countMissing(ctx, st, ids)
	if err != nil {
		t.Fatal(err)
	}
	if missing != 0 {
		t.Errorf("%d of %d acknowledged writes are missing after the failover from %s to %s", missing, len(ids), old.Name, leader.Name)
	}

	// The killed member rejoins as a replica of the new primary.
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Leader(ctx); err != nil || got != leader {
		t.Errorf("leader after the old primary rejoined = %v, %v; want %s", got, err, leader.Name)
	}
}

func snapshot(mu *sync.Mutex, ids *[]int64) []int64 {
	mu.Lock()
	defer mu.Unlock()
	return append([]int64(nil), *ids...)
}

// countMissing returns how many of ids the acks table lacks.
func countMissing(ctx context.Context, st *store.Store, ids []int64) (int, error) {
	var missing int
	err := st.ExecTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT count(*) FROM unnest($1::bigint[]) AS w(id) WHERE NOT EXISTS (SELECT 1 FROM acks a WHERE a.id = w.id)", ids).Scan(&missing)
	})
	if err != nil {
		return 0, fmt.Errorf("count missing: %w", err)
	}
	return missing, nil
}

// startEtcd builds and runs a one-member etcd server (the binary, whose
// v3 gRPC gateway Patroni speaks to; the embedded server of etcdtest
// listens on port 0, which its gateway cannot dial) and returns its client
// address.
func startEtcd(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "etcd")
	if err := testbin.Build(bin, "go.etcd.io/etcd/server/v3"); err != nil {
		t.Fatal(err)
	}
	client, peer := freeAddr(t), freeAddr(t)
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--name", "m0", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "m0=http://"+peer, "--unsafe-no-fsync")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for {
		resp, err := http.Get("http://" + client + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return client
			}
		}
		if t.Context().Err() != nil {
			t.Fatal(t.Context().Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestStrictSyncWithoutStandby kills both replicas: the primary keeps the
// leader key but cannot acknowledge a commit (it waits for a synchronous
// standby, wait event SyncRep), and acknowledges it once a replica is
// back. An isolated primary therefore acknowledges nothing it could lose.
func TestStrictSyncWithoutStandby(t *testing.T) {
	c := startStore(t)
	ctx := t.Context()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, leader.URLWithPassword("idem_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE TABLE acks (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var replicas []*pgha.Member
	for _, m := range c.Members() {
		if m != leader {
			replicas = append(replicas, m)
			if err := m.Kill(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	conn, err := pgx.Connect(ctx, leader.URLWithPassword("idem_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO acks (id) VALUES (1)")
		committed <- err
	}()
	// The commit waits for a synchronous standby.
	for {
		var event *string
		if err := admin.QueryRow(ctx, "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", pid).Scan(&event); err != nil {
			t.Fatal(err)
		}
		if event != nil && *event == "SyncRep" {
			break
		}
		select {
		case err := <-committed:
			t.Fatalf("the primary acknowledged a commit without a synchronous standby (err %v)", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	select {
	case err := <-committed:
		t.Fatalf("the primary acknowledged a commit without a synchronous standby (err %v)", err)
	default:
	}

	// A replica comes back and becomes the synchronous standby: the commit
	// is acknowledged, and the replica has it.
	if err := replicas[0].Start(); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatalf("commit once a standby is back: %v", err)
	}
	rconn, err := pgx.Connect(ctx, replicas[0].URLWithPassword("idem_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(context.Background())
	for {
		var n int
		if err := rconn.QueryRow(ctx, "SELECT count(*) FROM acks WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		// Flushed on the standby; its replay may lag a moment behind.
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentExitFailsStart: an agent that cannot run (here a patroni
// program that exits at once) fails Start with its log instead of a wait
// for ever.
func TestAgentExitFailsStart(t *testing.T) {
	broken := fakePatroni(t, "echo 'ModuleNotFoundError: no etcd here' >&2\nexit 1")
	_, err := pgha.Start(t.Context(), pgha.Options{
		Members:     []pgha.MemberSpec{{Name: "a"}, {Name: "b"}},
		EtcdHosts:   []string{"127.0.0.1:1"},
		PatroniPath: broken,
	})
	if err == nil || !strings.Contains(err.Error(), "no etcd here") {
		t.Fatalf("Start with an agent that exits: %v, want its log in the error", err)
	}
}

// TestStartTimesOut: a member that never becomes healthy (here an agent
// that runs and does nothing; in a chaos run, a PostgreSQL whose port
// another process took after it was picked) fails the start after
// StartTimeout instead of holding it forever.
func TestStartTimesOut(t *testing.T) {
	silent := fakePatroni(t, "exec sleep 600")
	_, err := pgha.Start(t.Context(), pgha.Options{
		Members:      []pgha.MemberSpec{{Name: "a"}, {Name: "b"}},
		EtcdHosts:    []string{"127.0.0.1:1"},
		PatroniPath:  silent,
		StartTimeout: time.Second,
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start with agents that never become healthy: %v, want a deadline", err)
	}
}

// fakePatroni writes a shell script standing in for the patroni agent
// (body, after the #! line) and returns its path; it skips the test
// without PostgreSQL's server binaries, which Start looks for first.
func fakePatroni(t *testing.T, body string) string {
	t.Helper()
	if _, err := pgserver.FindBinDir(); err != nil {
		t.Skip(err.Error())
	}
	// Readable by the postgres OS user the agents run as under root.
	dir, err := os.MkdirTemp("", "pgha-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "patroni")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

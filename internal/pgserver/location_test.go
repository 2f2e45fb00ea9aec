package pgserver_test

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/internal/tlsutil"
)

// TestDirForPrivateParent: as root, a directory under a parent of mode 0700
// (a home directory, say) cannot be searched by the postgres OS user;
// DirFor then gives a stable directory under /var/tmp, where the server
// starts, and a reachable directory is kept as it is.
func TestDirForPrivateParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("DirFor moves a directory only when the server runs as another OS user, which needs root; not root here")
	}
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	asked := filepath.Join(private, "state", "postgres")
	dir, err := pgserver.DirFor(asked)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if dir == asked || filepath.Dir(dir) != pgserver.FallbackRoot {
		t.Fatalf("DirFor(%s) = %s, want a directory under %s", asked, dir, pgserver.FallbackRoot)
	}
	if again, err := pgserver.DirFor(asked); err != nil || again != dir {
		t.Errorf("DirFor again = %s, %v; want the same %s", again, err, dir)
	}
	srv := startServer(t, pgserver.Options{Dir: dir})
	if got := queryString(t, srv.URL(), "SELECT 1::text"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != pg.Uid || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: uid %s mode %v, want postgres's (%s) and 0700", dir, uid, fi.Mode().Perm(), pg.Uid)
	}
	if again, err := pgserver.DirFor(asked); err != nil || again != dir {
		t.Errorf("DirFor once the directory exists = %s, %v; want %s", again, err, dir)
	}

	// Reachable: kept as it is.
	reachable := filepath.Join(tempDir(t), "pg")
	if got, err := pgserver.DirFor(reachable); err != nil || got != reachable {
		t.Errorf("DirFor(%s) = %s, %v; want it unchanged", reachable, got, err)
	}

	// A fallback another user planted (here: a symbolic link) is refused.
	other := filepath.Join(private, "other")
	planted, err := pgserver.DirFor(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(private, planted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(planted) })
	if got, err := pgserver.DirFor(other); err == nil {
		t.Errorf("DirFor with a symbolic link planted at %s = %s, want an error", planted, got)
	}
}

// TestTLS: with Options.TLS the server speaks TLS with a certificate that
// verify-full accepts against CAFile, and that a client trusting another
// authority refuses.
func TestTLS(t *testing.T) {
	srv := startServer(t, pgserver.Options{TLS: true})
	url := srv.TLSURLFor("postgres")
	if !strings.Contains(url, "sslmode=verify-full") || !strings.Contains(url, "sslrootcert=") {
		t.Fatalf("TLSURLFor = %s, want verify-full with a root certificate", url)
	}
	if got := queryString(t, url, "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"); got != "true" {
		t.Errorf("pg_stat_ssl.ssl = %q, want true", got)
	}
	key := queryString(t, srv.URL(), "SHOW ssl_key_file")
	fi, err := os.Stat(key)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("server key mode %v, want 0600", fi.Mode().Perm())
	}

	wrong := strings.Replace(url, "sslrootcert="+escapePath(srv.CAFile()), "sslrootcert="+escapePath(writeOtherCA(t)), 1)
	if wrong == url {
		t.Fatalf("could not swap the root certificate in %s", url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, wrong); err == nil {
		_ = conn.Close(ctx)
		t.Error("verify-full against another authority connected")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("verify-full against another authority: %v, want a certificate error", err)
	}
}

// escapePath is how url.Values encodes a path.
func escapePath(p string) string { return strings.ReplaceAll(p, "/", "%2F") }

// writeOtherCA writes the certificate of a new CA that signed nothing and
// returns its path.
func writeOtherCA(t *testing.T) string {
	t.Helper()
	ca, err := tlsutil.NewCA(t.TempDir(), "another CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertFile
}

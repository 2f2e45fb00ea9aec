package cluster_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/pgserver"
)

// TestStateDirInPrivateDirectory runs a cluster the way the README does
// (--state-dir .state) from a checkout in a directory of mode 0700, such as
// root's home: PostgreSQL, which runs as the postgres OS user, keeps its
// data where that user can reach it, and state/postgres links there. The
// secrets handed to the processes are in files only the owner may read.
func TestStateDirInPrivateDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root runs PostgreSQL as another OS user (postgres), which is what a private directory stops; not root here")
	}
	checkout := t.TempDir()
	if err := os.Chmod(checkout, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(checkout)
	c := startCluster(t, cluster.Config{StateDir: ".state"})
	info := c.Info()
	link := filepath.Join(checkout, ".state", "postgres")
	pgDir, err := os.Readlink(link)
	if err != nil {
		t.Fatalf("%s: %v, want a link to PostgreSQL's directory", link, err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pgDir) })
	if !strings.HasPrefix(pgDir, pgserver.FallbackRoot+"/") {
		t.Errorf("PostgreSQL's directory %s, want one under %s", pgDir, pgserver.FallbackRoot)
	}
	for tenant, token := range info.Tokens {
		if resp := postPayment(t, info.Regions[0].URL, token, "key-"+tenant, "invoice-home"); resp.status != http.StatusCreated {
			t.Errorf("POST as %s: %d %s", tenant, resp.status, resp.body)
		}
	}

	secrets := filepath.Join(c.StateDir(), "secrets")
	for path, want := range map[string]os.FileMode{secrets: 0o700, filepath.Join(secrets, "auth-tokens"): 0o600} {
		if fi, err := os.Stat(path); err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	stopCluster(t, c)
	if _, err := os.Stat(secrets); !os.IsNotExist(err) {
		t.Errorf("%s after Stop: %v, want it removed", secrets, err)
	}
}

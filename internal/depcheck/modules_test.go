package depcheck_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// toolingModules are modules a service that requires the library module
// must not find in its build list: the repository's own tooling modules
// and what only they need. A requirement in the library's go.mod reaches
// every importer's module graph and can raise its versions.
var toolingModules = []string{
	module + "/chaos",
	module + "/cluster",
	module + "/cmd/idemctl",
	module + "/idemtest",
	module + "/tests",
	"github.com/testcontainers/testcontainers-go",
	"github.com/moby/moby",
	"github.com/Shopify/toxiproxy/v2",
	"github.com/anishathalye/porcupine",
	"go.etcd.io/etcd/server/v3",
	"github.com/rs/zerolog",
}

// TestConsumerBuildList builds examples/consumer, a module of its own that
// requires the library module and imports store, engine, idemhttp,
// idemgrpc and fencing, out of the workspace (as a user's module builds), and checks
// that none of the tooling modules is in its build list, nor in the
// library module's own requirements.
func TestConsumerBuildList(t *testing.T) {
	goCmd := goTool(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(goCmd, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
		}
		return string(out)
	}
	consumer := filepath.Join(root, "examples", "consumer")
	run(consumer, "build", "-o", os.DevNull, ".")
	for dir, list := range map[string]string{
		"examples/consumer":  run(consumer, "list", "-m", "-f", "{{.Path}}", "all"),
		"the library module": run(root, "list", "-m", "-f", "{{.Path}}", "all"),
	} {
		mods := strings.Fields(list)
		if len(mods) < 2 {
			t.Fatalf("%s: build list %q is too short to be real", dir, mods)
		}
		for _, m := range mods {
			for _, bad := range toolingModules {
				if m == bad {
					t.Errorf("%s's build list holds %s", dir, m)
				}
			}
		}
	}
}

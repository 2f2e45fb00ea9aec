package depcheck_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/idemcoord/idem"

// libraries are the packages a user imports. Each may pull what it needs
// (pgx for store, the etcd client for fencing, client_golang and the
// OpenTelemetry API) and nothing of the service's programs, exporters,
// servers or tests.
var libraries = []string{
	module,
	module + "/coordclient",
	module + "/engine",
	module + "/fencing",
	module + "/fingerprint",
	module + "/idemgrpc",
	module + "/idemhttp",
	module + "/idemprom",
	module + "/memcoord",
	module + "/sidecar",
	module + "/store",
}

// forbidden are packages no library package may pull (a path matches an
// entry and the packages below it).
var forbidden = []string{
	// Their import registers handlers on http.DefaultServeMux (see
	// registersVia for the two a dependency the library needs brings).
	"net/http/pprof",
	"expvar",
	"golang.org/x/net/trace",
	// Exporters and the SDK belong in the programs that export.
	"go.opentelemetry.io/otel/exporters",
	"go.opentelemetry.io/otel/sdk",
	// Servers and test machinery.
	"go.etcd.io/etcd/server",
	"github.com/testcontainers",
	"github.com/Shopify/toxiproxy",
	"github.com/anishathalye/porcupine",
	"github.com/moby",
	"go.uber.org/goleak",
	"testing",
	// The service's own programs, tools and test helpers.
	module + "/chaos",
	module + "/cluster",
	module + "/internal/admin",
	module + "/cmd/idemctl/internal/bench",
	module + "/tests",
	module + "/internal/containertest",
	module + "/internal/etcdtest",
	module + "/internal/pgtest",
	module + "/internal/storetest",
	module + "/internal/telemetry/otlp",
}

// registersVia names, for a forbidden package that a dependency the
// library needs imports, the one package it may come through. Each still
// registers on http.DefaultServeMux in the programs that link it, which is
// why TestNothingOnDefaultServeMux leaves out the library packages that
// pull it.
var registersVia = map[string]string{
	// client_golang's prometheus package imports expvar (for its
	// ExpvarCollector), whose init registers GET /debug/vars. Only
	// idemprom, which a program imports to count with Prometheus, links
	// it (see only).
	"expvar": "github.com/prometheus/client_golang/prometheus",
	// gRPC imports golang.org/x/net/trace, whose init registers
	// /debug/requests and /debug/events, unless built with
	// -tags grpcnotrace. fencing uses the etcd client, which uses gRPC.
	"golang.org/x/net/trace": "google.golang.org/grpc",
}

// only are dependencies that only the library packages listed may have:
// the storage driver is store's alone, the etcd client fencing's alone,
// gRPC fencing's (under the etcd client) and idemgrpc's, client_golang
// idemprom's alone (idemhttp, idemgrpc and sidecar count through their
// Metrics interfaces).
var only = map[string][]string{
	"github.com/prometheus":  {module + "/idemprom"},
	"github.com/jackc":       {module + "/store"},
	"go.etcd.io":             {module + "/fencing"},
	"google.golang.org/grpc": {module + "/fencing", module + "/idemgrpc"},
}

// stdOnly are library packages that import nothing outside the standard
// library and this package list: the root package is the domain
// vocabulary, with no dependency on storage or transport, and the
// in-memory coordinator is what users' unit tests link instead of a store.
var stdOnly = []string{module, module + "/memcoord"}

// under reports whether path is prefix or a package below it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// goTool returns the go command: the one on PATH, else $GOROOT/bin/go.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no go command on PATH or in $GOROOT/bin: cannot list the library's dependencies")
	return ""
}

// pkg is one package of `go list -deps`.
type pkg struct {
	std     bool
	imports []string
}

// listDeps returns the import graph of pkgs and all their dependencies,
// as the go command resolves it for a build without tags.
func listDeps(t *testing.T, pkgs []string) map[string]pkg {
	t.Helper()
	return listDepsTagged(t, "", pkgs)
}

// listDepsTagged is listDeps for a build with tags (comma-separated).
func listDepsTagged(t *testing.T, tags string, pkgs []string) map[string]pkg {
	t.Helper()
	args := append([]string{"list", "-deps", "-tags", tags, "-f", "{{.ImportPath}} {{.Standard}}{{range .Imports}} {{.}}{{end}}"}, pkgs...)
	cmd := exec.Command(goTool(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	g := make(map[string]pkg)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			t.Fatalf("go list: unexpected line %q", sc.Text())
		}
		g[f[0]] = pkg{std: f[1] == "true", imports: f[2:]}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return g
}

// chains returns, for every package root depends on, the chain of imports
// that first reaches it from root (breadth first, so a shortest one).
func chains(g map[string]pkg, root string) map[string][]string {
	via := map[string][]string{root: {root}}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p].imports {
			if _, seen := via[imp]; !seen {
				via[imp] = append(slices.Clip(via[p]), imp)
				queue = append(queue, imp)
			}
		}
	}
	return via
}

// TestLibraryDependencies: no library package pulls a forbidden package
// (but through the one importer registersVia allows), another package's
// driver or client (only), or, for the root package, anything outside the
// standard library. Each rule broken is reported once, with the shortest
// chain of imports that breaks it.
func TestLibraryDependencies(t *testing.T) {
	g := listDeps(t, libraries)
	for _, lib := range libraries {
		t.Run(path.Base(lib), func(t *testing.T) {
			deps := chains(g, lib)
			delete(deps, lib)
			for _, f := range forbidden {
				hits := matching(deps, func(p string) bool { return under(p, f) })
				if len(hits) == 0 {
					continue
				}
				if allowed, ok := registersVia[f]; ok {
					for _, p := range hits {
						if bad := importersBut(g, deps, p, allowed); len(bad) > 0 {
							t.Errorf("pulls %s through %s (only %s may bring it): %s",
								p, strings.Join(bad, ", "), allowed, strings.Join(append(slices.Clone(deps[bad[0]]), p), " -> "))
						}
					}
					continue
				}
				t.Errorf("pulls %s: %s", f, shortest(deps, hits))
			}
			for prefix, owners := range only {
				if slices.Contains(owners, lib) {
					continue
				}
				if hits := matching(deps, func(p string) bool { return under(p, prefix) }); len(hits) > 0 {
					t.Errorf("pulls %s, which only %s may: %s", prefix, strings.Join(owners, " and "), shortest(deps, hits))
				}
			}
			if slices.Contains(stdOnly, lib) {
				if hits := matching(deps, func(p string) bool { return !g[p].std && !slices.Contains(libraries, p) }); len(hits) > 0 {
					t.Errorf("pulls %d packages outside the standard library: %s", len(hits), shortest(deps, hits))
				}
			}
		})
	}
}

// matching returns the packages of deps for which match is true, sorted.
func matching(deps map[string][]string, match func(string) bool) []string {
	var hits []string
	for p := range deps {
		if match(p) {
			hits = append(hits, p)
		}
	}
	slices.Sort(hits)
	return hits
}

// shortest returns the shortest chain of imports to one of hits, and how
// many other packages hits holds.
func shortest(deps map[string][]string, hits []string) string {
	best := hits[0]
	for _, p := range hits[1:] {
		if len(deps[p]) < len(deps[best]) {
			best = p
		}
	}
	s := strings.Join(deps[best], " -> ")
	if n := len(hits) - 1; n > 0 {
		s += fmt.Sprintf(" (and %d more packages)", n)
	}
	return s
}

// importersBut returns the packages among deps that import p, other than
// allowed.
func importersBut(g map[string]pkg, deps map[string][]string, p, allowed string) []string {
	var bad []string
	for q := range deps {
		if q != allowed && slices.Contains(g[q].imports, p) {
			bad = append(bad, q)
		}
	}
	slices.Sort(bad)
	return bad
}

// TestOperatorBuild: what the production image ships, idemd and idemctl's
// operator build (-tags operator), links no test machinery, no chaos
// harness or local cluster launcher, no toxiproxy, porcupine,
// testcontainers or etcd server.
func TestOperatorBuild(t *testing.T) {
	progs := []string{module + "/cmd/idemd", module + "/cmd/idemctl"}
	g := listDepsTagged(t, "operator", progs)
	tooling := []string{
		"go.etcd.io/etcd/server", "github.com/testcontainers", "github.com/Shopify/toxiproxy",
		"github.com/anishathalye/porcupine", "github.com/moby", "go.uber.org/goleak", "testing",
		module + "/chaos", module + "/cluster", module + "/cmd/idemctl/internal/bench", module + "/tests",
		module + "/internal/images", module + "/internal/etcdtest", module + "/internal/pgtest", module + "/internal/storetest",
	}
	for _, prog := range progs {
		deps := chains(g, prog)
		for _, f := range tooling {
			if hits := matching(deps, func(p string) bool { return under(p, f) }); len(hits) > 0 {
				t.Errorf("%s (operator build) pulls %s: %s", path.Base(prog), f, shortest(deps, hits))
			}
		}
	}
	// Without the tag, idemctl is the whole tool: the test above would
	// catch a harness package if the tag stopped leaving it out.
	full := chains(listDeps(t, progs[1:]), progs[1])
	if hits := matching(full, func(p string) bool { return under(p, module+"/chaos") }); len(hits) == 0 {
		t.Errorf("idemctl without the operator tag does not link the chaos harness: the check above proves nothing")
	}
}

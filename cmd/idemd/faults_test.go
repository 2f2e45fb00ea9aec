package main

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/testbin"
)

// faultFlags are the flags only a build with -tags failpoints has.
var faultFlags = []string{"-break", "-duplicate-delivery"}

// usage runs `bin -h` and returns what it prints.
func usage(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -h: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "-database-url") {
		t.Fatalf("%s -h printed no usage:\n%s", bin, out)
	}
	return string(out)
}

// TestReleaseBuildHasNoFaultInjection: the idemd built as the README builds
// it (no tags) has no --break or --duplicate-delivery and refuses them, and
// links neither the failpoint package nor the provider simulator.
func TestReleaseBuildHasNoFaultInjection(t *testing.T) {
	u := usage(t, idemdBin)
	for _, f := range faultFlags {
		if strings.Contains(u, f) {
			t.Errorf("release idemd's usage lists %s:\n%s", f, u)
		}
	}
	if strings.Contains(u, "break") {
		t.Errorf("release idemd's usage mentions break:\n%s", u)
	}
	out, err := exec.Command(idemdBin, "--break", "no-fencing", "--database-url", "postgres://unused").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "flag provided but not defined: -break") {
		t.Errorf("release idemd --break no-fencing = %v, want exit 2 for an undefined flag:\n%s", err, out)
	}
	deps, err := testbin.Deps(nil, "github.com/idemcoord/idem/cmd/idemd")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(deps, "github.com/idemcoord/idem/payments") {
		t.Fatalf("go list -deps cmd/idemd lacks payments: %v", deps)
	}
	for _, pkg := range []string{"github.com/idemcoord/idem/internal/failpoint", "github.com/idemcoord/idem/provider/simulator"} {
		if slices.Contains(deps, pkg) {
			t.Errorf("release idemd links %s", pkg)
		}
	}
}

// TestFailpointsBuildHasFaultInjection: built with -tags failpoints, idemd
// has the flags the chaos harness uses.
func TestFailpointsBuildHasFaultInjection(t *testing.T) {
	u := usage(t, idemdFailpointsBin)
	for _, f := range faultFlags {
		if !strings.Contains(u, f) {
			t.Errorf("idemd built with -tags failpoints lacks %s:\n%s", f, u)
		}
	}
	deps, err := testbin.Deps([]string{testbin.FailpointsTag}, "github.com/idemcoord/idem/cmd/idemd")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(deps, "github.com/idemcoord/idem/internal/failpoint") {
		t.Error("idemd built with -tags failpoints does not link internal/failpoint")
	}
}

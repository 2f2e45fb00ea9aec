package chaos

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/testbin"
)

// TestRequireFailpoints: a chaos run refuses a release idemd (and anything
// that is not a Go binary) with the command that builds the right one, and
// accepts the idemd built with -tags failpoints.
func TestRequireFailpoints(t *testing.T) {
	if err := RequireFailpoints(idemdPath); err != nil {
		t.Errorf("idemd built with -tags failpoints: %v", err)
	}
	dir := t.TempDir()
	release := filepath.Join(dir, "idemd")
	if err := testbin.Build(release, "github.com/idemcoord/idem/cmd/idemd"); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{release, script} {
		err := RequireFailpoints(bin)
		if !errors.Is(err, ErrNoFailpoints) || !strings.Contains(err.Error(), BuildCommand) {
			t.Errorf("RequireFailpoints(%s) = %v, want ErrNoFailpoints naming %q", bin, err, BuildCommand)
		}
	}
	opts := Options{Scenario: "completed-replay", OutDir: dir, Idemd: release, Etcd: script, Idemctl: script}
	if err := opts.setDefaults(); !errors.Is(err, ErrNoFailpoints) {
		t.Errorf("Options with a release idemd: %v, want ErrNoFailpoints", err)
	}
}

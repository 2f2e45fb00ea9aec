// Package testbin builds the project's binaries (and the pinned etcd server)
// for tests that run them as real processes.
package testbin

import (
	"fmt"
	"go/build"
	"os/exec"
	"path/filepath"
)

// Paths are built binaries.
type Paths struct {
	Idemd, Idemctl, Etcd string
}

// Build runs `go build -o out pkgs...` with the go command on PATH (or this
// toolchain's). out is a file, or a directory ending in a separator.
func Build(out string, pkgs ...string) error {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		if goCmd, err = exec.LookPath(filepath.Join(build.Default.GOROOT, "bin", "go")); err != nil {
			return fmt.Errorf("testbin: find the go command: %w", err)
		}
	}
	cmd := exec.Command(goCmd, append([]string{"build", "-o", out}, pkgs...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbin: go build %s: %w\n%s", pkgs, err, b)
	}
	return nil
}

// BuildAll builds idemd, idemctl and the etcd server pinned in go.mod into
// dir.
func BuildAll(dir string) (Paths, error) {
	p := Paths{Idemd: filepath.Join(dir, "idemd"), Idemctl: filepath.Join(dir, "idemctl"), Etcd: filepath.Join(dir, "etcd")}
	if err := Build(dir+string(filepath.Separator), "github.com/idemcoord/idem/cmd/idemd", "github.com/idemcoord/idem/cmd/idemctl"); err != nil {
		return Paths{}, err
	}
	if err := Build(p.Etcd, "go.etcd.io/etcd/server/v3"); err != nil {
		return Paths{}, err
	}
	return p, nil
}

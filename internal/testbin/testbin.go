// Package testbin builds the project's binaries (and the pinned etcd server)
// for tests that run them as real processes.
package testbin

import (
	"fmt"
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
)

// FailpointsTag is the build tag that compiles fault injection into idemd:
// the deliberately broken engines (--break), --duplicate-delivery,
// IDEM_FAILPOINTS and IDEM_CLOCK_SKEW. Release builds leave it out; chaos
// runs and the tests of those modes need it.
const FailpointsTag = "failpoints"

// Paths are built binaries.
type Paths struct {
	Idemd, Idemctl, Etcd string
}

// Build runs `go build -o out pkgs...` with the go command on PATH (or this
// toolchain's). out is a file, or a directory ending in a separator.
func Build(out string, pkgs ...string) error {
	return BuildTags(nil, out, pkgs...)
}

// BuildTags is Build with build tags (`go build -tags a,b`); no tags is a
// release build.
func BuildTags(tags []string, out string, pkgs ...string) error {
	goCmd, err := goCommand()
	if err != nil {
		return err
	}
	args := []string{"build"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "-o", out)
	cmd := exec.Command(goCmd, append(args, pkgs...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbin: go %s: %w\n%s", strings.Join(append(args, pkgs...), " "), err, b)
	}
	return nil
}

// Deps lists the import paths pkg links (`go list -deps`, with tags),
// pkg and the standard library included.
func Deps(tags []string, pkg string) ([]string, error) {
	goCmd, err := goCommand()
	if err != nil {
		return nil, err
	}
	args := []string{"list", "-deps"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command(goCmd, append(args, pkg)...).Output()
	if err != nil {
		return nil, fmt.Errorf("testbin: go %s %s: %w", strings.Join(args, " "), pkg, err)
	}
	return strings.Fields(string(out)), nil
}

// ModuleVersion returns the version of module path in the build list
// (`go list -m`), which in the repository's workspace is the version every
// module of it builds with.
func ModuleVersion(path string) (string, error) {
	goCmd, err := goCommand()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(goCmd, "list", "-m", "-f", "{{.Version}}", path).Output()
	if err != nil {
		return "", fmt.Errorf("testbin: go list -m %s: %w", path, err)
	}
	v := strings.TrimSpace(string(out))
	if v == "" {
		return "", fmt.Errorf("testbin: %s has no version in the build list", path)
	}
	return v, nil
}

// goCommand finds the go command on PATH, or this toolchain's.
func goCommand() (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		if goCmd, err = exec.LookPath(filepath.Join(build.Default.GOROOT, "bin", "go")); err != nil {
			return "", fmt.Errorf("testbin: find the go command: %w", err)
		}
	}
	return goCmd, nil
}

// BuildAll builds idemd and idemctl (with tags, e.g. FailpointsTag for
// chaos runs) and the etcd server pinned in go.mod into dir.
func BuildAll(dir string, tags ...string) (Paths, error) {
	p := Paths{Idemd: filepath.Join(dir, "idemd"), Idemctl: filepath.Join(dir, "idemctl"), Etcd: filepath.Join(dir, "etcd")}
	if err := BuildTags(tags, dir+string(filepath.Separator), "github.com/idemcoord/idem/cmd/idemd", "github.com/idemcoord/idem/cmd/idemctl"); err != nil {
		return Paths{}, err
	}
	if err := Build(p.Etcd, "go.etcd.io/etcd/server/v3"); err != nil {
		return Paths{}, err
	}
	return p, nil
}

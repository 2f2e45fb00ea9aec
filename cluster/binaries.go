package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildCommand builds every binary a cluster runs into ./bin, from the
// module root.
const BuildCommand = "go build -o bin/ ./cmd/idemd ./cmd/idemctl && go build -o bin/etcd go.etcd.io/etcd/server/v3"

// FindBinary returns the path of the executable name (such as "idemd"):
// next to the running executable (os.Executable, symlinks resolved), then
// in ./bin, then on PATH. The error says how to build it.
func FindBinary(name string) (string, error) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		dirs = append(dirs, filepath.Dir(exe))
	}
	dirs = append(dirs, "bin")
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return filepath.Abs(p)
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("cluster: %s binary not found next to this executable, in ./bin or on PATH; from the module root, build the binaries and run with `%s && bin/idemctl up`, or pass its path: %w", name, BuildCommand, exec.ErrNotFound)
}

// FindIdemctl returns the idemctl binary, which runs the provider
// simulator: the running executable if it is idemctl, else
// FindBinary("idemctl").
func FindIdemctl() (string, error) {
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "idemctl" {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		return exe, nil
	}
	return FindBinary("idemctl")
}

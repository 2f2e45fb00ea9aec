package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/idemcoord/idem/cluster"
)

// nodeControl restarts nodes with a command line or environment of their
// own. A cluster.Process keeps the command line it was started with, so the
// cluster runs idemd through a small wrapper script that reads, at every
// start, per-node overrides from files: <dir>/<node>.args (extra flags,
// appended, so they win over the cluster's) and <dir>/<node>.env
// (KEY='value' lines). The wrapper execs idemd, so the node keeps the
// wrapper's pid, process group and parent-death signal.
type nodeControl struct {
	dir     string // overrides directory
	wrapper string // the script the cluster runs as idemd

	mu   sync.Mutex
	args map[string][]string
	env  map[string][]string
}

// wrapperScript is the idemd wrapper; %[1]s is the overrides directory and
// %[2]s the real idemd binary.
const wrapperScript = `#!/bin/sh
# Written by the chaos harness: runs idemd with per-node overrides.
node=
prev=
for a in "$@"; do
	if [ "$prev" = "--node-id" ]; then node="$a"; fi
	prev="$a"
done
extra=
if [ -n "$node" ] && [ -f '%[1]s'/"$node".env ]; then
	set -a
	. '%[1]s'/"$node".env
	set +a
fi
if [ -n "$node" ] && [ -f '%[1]s'/"$node".args ]; then
	extra=$(cat '%[1]s'/"$node".args)
fi
# $extra is split on purpose: one flag or value per word.
exec '%[2]s' "$@" $extra
`

// newNodeControl writes the wrapper for the idemd binary into dir.
func newNodeControl(dir, idemd string) (*nodeControl, error) {
	if strings.ContainsAny(dir+idemd, "'\n") {
		return nil, fmt.Errorf("chaos: paths with quotes or newlines are not supported: %q, %q", dir, idemd)
	}
	od := filepath.Join(dir, "overrides")
	if err := os.MkdirAll(od, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: overrides directory: %w", err)
	}
	w := filepath.Join(dir, "idemd-chaos")
	if err := os.WriteFile(w, []byte(fmt.Sprintf(wrapperScript, od, idemd)), 0o755); err != nil {
		return nil, fmt.Errorf("chaos: write idemd wrapper: %w", err)
	}
	return &nodeControl{dir: od, wrapper: w, args: map[string][]string{}, env: map[string][]string{}}, nil
}

// set replaces node's overrides (nil clears them); they apply from the
// node's next start.
func (n *nodeControl) set(node string, args, env []string) error {
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\") {
			return fmt.Errorf("chaos: override argument %q must be one word without quotes", a)
		}
	}
	var envLines []string
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(v, "'\n") {
			return fmt.Errorf("chaos: override environment %q must be KEY=value without quotes", kv)
		}
		envLines = append(envLines, k+"='"+v+"'\n")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := writeOrRemove(filepath.Join(n.dir, node+".args"), strings.Join(args, "\n")); err != nil {
		return err
	}
	if err := writeOrRemove(filepath.Join(n.dir, node+".env"), strings.Join(envLines, "")); err != nil {
		return err
	}
	n.args[node], n.env[node] = slices.Clone(args), slices.Clone(env)
	return nil
}

// overrides returns node's current overrides.
func (n *nodeControl) overrides(node string) (args, env []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.args[node]), slices.Clone(n.env[node])
}

func writeOrRemove(path, content string) error {
	if content == "" {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("chaos: remove override: %w", err)
		}
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o644); err != nil {
		return fmt.Errorf("chaos: write override: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("chaos: write override: %w", err)
	}
	return nil
}

// restartWith sets p's overrides and restarts it (gracefully) with them.
func (n *nodeControl) restartWith(ctx context.Context, p *cluster.Process, args, env []string) error {
	if err := n.set(p.Name(), args, env); err != nil {
		return err
	}
	if err := p.Restart(ctx); err != nil {
		return fmt.Errorf("chaos: restart %s: %w", p.Name(), err)
	}
	return nil
}

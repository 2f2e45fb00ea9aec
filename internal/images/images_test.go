package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTagsSameFromAnywhere: the content tags do not depend on how the
// module root is named, so `idemctl images tags`, `images build` and the
// tests agree.
func TestTagsSameFromAnywhere(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := Tags(root)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := Tags("../..")
	if err != nil {
		t.Fatal(err)
	}
	if abs != rel {
		t.Errorf("Tags(%s) = %+v, Tags(../..) = %+v; want the same", root, abs, rel)
	}
	for _, tag := range []string{abs.Debian, abs.Postgres, abs.Patroni, abs.Golang, abs.Idem} {
		if _, v, ok := strings.Cut(tag, ":"); !ok || v == "" {
			t.Errorf("tag %q has no version", tag)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Errorf("ModuleRoot = %s without go.mod: %v", root, err)
	}
}

// TestModuleRootFromANestedModule: from a tooling module nested in the
// repository (idemtest has a go.mod of its own), ModuleRoot is the
// repository's root, where the library's go.mod is.
func TestModuleRootFromANestedModule(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	nested, err := ModuleRoot(filepath.Join(root, "idemtest"))
	if err != nil || nested != root {
		t.Errorf("ModuleRoot(idemtest) = %q, %v; want %q", nested, err, root)
	}
}

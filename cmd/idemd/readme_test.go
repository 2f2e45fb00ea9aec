package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// TestReadmeListsEveryFlag: the configuration table of docs/operating.md
// names every flag idemd accepts, so a new flag cannot ship undocumented.
func TestReadmeListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "## Configuration")
	if start < 0 {
		t.Fatal("docs/operating.md has no Configuration section")
	}
	section := readme[start:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	fs := flagSetOf(t)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(section, "`--"+f.Name+"`") {
			t.Errorf("docs/operating.md's Configuration section does not list --%s", f.Name)
		}
	})
	if n < 20 {
		t.Fatalf("found only %d flags; flagSetOf needs updating", n)
	}
}

// flagSetOf returns the flag set ParseFlags defines, captured through the
// -help path (which defines every flag before it stops).
func flagSetOf(t *testing.T) *flag.FlagSet {
	t.Helper()
	m := NewMain()
	var fs *flag.FlagSet
	m.onFlags = func(f *flag.FlagSet) { fs = f; f.SetOutput(io.Discard) }
	_ = m.ParseFlags([]string{"-help"}, func(string) string { return "" })
	if fs == nil {
		t.Fatal("ParseFlags did not report its flag set")
	}
	return fs
}

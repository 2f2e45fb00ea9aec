package cli

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseTokens checks the --auth-tokens parser: it never panics, every
// accepted token and tenant is non-empty and free of the list separators
// that would make it ambiguous, and writing the map back as a list parses to
// the same map.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"tok-a=tenant-a", "tok-a=tenant-a,tok-b=tenant-b", "", " , ", "a=", "=b", "a=b=c", "a=b,a=c", " a = b ", "a\x00=b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseTokens(s)
		if err != nil {
			return
		}
		pairs := make([]string, 0, len(m))
		for k, v := range m {
			if k == "" || v == "" || strings.ContainsAny(k, ",=") || strings.Contains(v, ",") {
				t.Fatalf("ParseTokens(%q) accepted %q=%q", s, k, v)
			}
			pairs = append(pairs, k+"="+v)
		}
		slices.Sort(pairs)
		again, err := ParseTokens(strings.Join(pairs, ","))
		if err != nil || len(again) != len(m) {
			t.Fatalf("ParseTokens(%q) = %v; its list form parses to %v, %v", s, m, again, err)
		}
		for k, v := range m {
			if again[k] != v {
				t.Fatalf("ParseTokens(%q): %q maps to %q, then to %q", s, k, v, again[k])
			}
		}
	})
}

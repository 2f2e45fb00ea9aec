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
			if k == "" || v == "" || strings.ContainsAny(k, ",=") || strings.Contains(v, ",") ||
				k != strings.TrimSpace(k) || v != strings.TrimSpace(v) {
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

// TestParseTokensLikeTheFile: the IDEM_AUTH_TOKENS form follows the tokens
// file's rules: a token given twice is refused (it would silently take the
// last tenant), and spaces inside a pair are trimmed (a token with a trailing
// space could never match a request).
func TestParseTokensLikeTheFile(t *testing.T) {
	if m, err := ParseTokens("tok=tenant-a,tok=tenant-b"); err == nil {
		t.Errorf("a repeated token was accepted: %v", m)
	}
	m, err := ParseTokens(" tok-a = tenant-a ,tok-b=tenant-b")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m, map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"}; len(got) != 2 || got["tok-a"] != want["tok-a"] || got["tok-b"] != want["tok-b"] {
		t.Errorf("ParseTokens = %v, want %v", got, want)
	}
}

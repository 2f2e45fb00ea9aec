package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/ident"
)

// FuzzParseTokens checks both token parsers, the IDEM_AUTH_TOKENS list
// (ParseTokens) and the tokens file (parseTokensFile), on the same input:
// they never panic, every accepted token is non-empty, trimmed and free of
// the separators that would make it ambiguous, every accepted tenant is a
// tenant name (ident.CheckTenant), and writing the map back in the parser's
// own form parses to the same map.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"tok-a=tenant-a", "tok-a=tenant-a,tok-b=tenant-b", "", " , ", "a=", "=b", "a=b=c", "a=b,a=c", " a = b ", "a\x00=b",
		"tok=tenant-a,x=y", "tok-a=tenant-a\ntok-b=tenant-b\n", "# c\n\n a = b \r\n", "tok=tenant a", "tok=t\u00a0a", "tok=cafe\u0301"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if m, err := ParseTokens(s); err == nil {
			checkTokens(t, "ParseTokens", s, m, ",")
			again, err := ParseTokens(joinTokens(m, ","))
			sameTokens(t, "ParseTokens", s, m, again, err)
		}
		if m, err := parseTokensFile("tokens", []byte(s)); err == nil {
			checkTokens(t, "parseTokensFile", s, m, "")
			again, err := parseTokensFile("tokens", []byte(joinTokens(m, "\n")))
			sameTokens(t, "parseTokensFile", s, m, again, err)
		}
	})
}

// checkTokens fails t unless every token of m is non-empty, trimmed and
// free of '=' and of the characters in sep, and every tenant is a tenant
// name.
func checkTokens(t *testing.T, parser, in string, m map[string]string, sep string) {
	t.Helper()
	for k, v := range m {
		if k == "" || strings.ContainsAny(k, "="+sep) || k != strings.TrimSpace(k) || ident.CheckTenant(v) != nil {
			t.Fatalf("%s(%q) accepted %q=%q", parser, in, k, v)
		}
	}
}

// joinTokens writes m as token=tenant pairs separated by sep, in token order.
func joinTokens(m map[string]string, sep string) string {
	pairs := make([]string, 0, len(m))
	for k, v := range m {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, sep)
}

// sameTokens fails t unless again (parsed from m written back) equals m.
func sameTokens(t *testing.T, parser, in string, m, again map[string]string, err error) {
	t.Helper()
	if err != nil || len(again) != len(m) {
		t.Fatalf("%s(%q) = %v; written back it parses to %v, %v", parser, in, m, again, err)
	}
	for k, v := range m {
		if again[k] != v {
			t.Fatalf("%s(%q): %q maps to %q, then to %q", parser, in, k, v, again[k])
		}
	}
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

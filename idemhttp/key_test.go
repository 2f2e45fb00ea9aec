package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

func TestKeyFromHeader(t *testing.T) {
	for _, c := range []struct {
		vals []string
		key  string
		code string
	}{
		{[]string{"abc-123"}, "abc-123", ""},
		{[]string{`"abc-123"`}, "abc-123", ""},
		{[]string{` "a\"b\\c" `}, `a"b\c`, ""},
		{nil, "", idem.ECodeKeyMissing},
		{[]string{"a", "b"}, "", idem.ECodeKeyInvalid},
		{[]string{`"abc`}, "", idem.ECodeKeyInvalid},
		{[]string{`"a"b`}, "", idem.ECodeKeyInvalid},
		{[]string{`"a";x=1`}, "", idem.ECodeKeyInvalid},
		{[]string{`"a\nb"`}, "", idem.ECodeKeyInvalid},
		{[]string{`""`}, "", idem.ECodeKeyInvalid},
		{[]string{`"a b"`}, "", idem.ECodeKeyInvalid}, // a space is no visible character
		{[]string{""}, "", idem.ECodeKeyInvalid},
	} {
		h := http.Header{}
		if c.vals != nil {
			h[idemhttp.HeaderKey] = c.vals
		}
		key, err := idemhttp.KeyFromHeader(h)
		switch {
		case c.code == "" && (err != nil || key != c.key):
			t.Errorf("%q: %q, %v; want %q", c.vals, key, err, c.key)
		case c.code != "" && idem.ErrorCode(err) != c.code:
			t.Errorf("%q: %q, %v; want %s", c.vals, key, err, c.code)
		}
	}
}

// FuzzParseKey: no value panics; an accepted key is valid, and its
// sf-string form is the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"`, `"\`, `""`, "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, ok := idemhttp.ParseKey(s)
		if !ok {
			return
		}
		if !idem.ValidKey(key) {
			t.Fatalf("ParseKey(%q) accepted invalid %q", s, key)
		}
		quoted := `"`
		for _, c := range []byte(key) {
			if c == '"' || c == '\\' {
				quoted += `\`
			}
			quoted += string(c)
		}
		if again, ok := idemhttp.ParseKey(quoted + `"`); !ok || again != key {
			t.Fatalf("the sf-string of %q reads back as %q, %v", key, again, ok)
		}
	})
}

package sidecar_test

import (
	"errors"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/sidecar"
)

var (
	refusedPaths = []string{
		"/transfers/..", "/transfers/.", "/transfers/../admin", "/transfers/./x", `/transfers/..\admin`, `/transfers\..\admin`,
		"/transfers/%2e%2e/admin", "/transfers/%2E%2E/admin", "/transfers/%2e%2E/admin", "/transfers/.%2e/admin",
		"/transfers/%2e./admin", "/transfers/%2e", "/transfers/x/%2e%2e/%2e%2e/admin",
		"/transfers/..%2fadmin", "/transfers/..%2Fadmin", "/transfers/x%2f..", "/transfers/a%2fb",
		"/transfers/..%5cadmin", "/transfers/..%5Cadmin", "/transfers/a%5cb",
		"/transfers/%252e%252e/admin", "/transfers/%252E%252e/admin", "/transfers/..%252fadmin", "/transfers/..%255Cadmin",
		"/transfers/%25252e%25252e/admin", "/transfers/%2525252e", "/transfers/%25%32%65%25%32%65/admin",
		"/transfers/..;/admin", "/transfers/.;x/admin", "/transfers/%2e%2e;jsessionid=1/admin", "/transfers/..%3b/admin",
		"/transfers/..%00/admin", "/transfers/a%0ab", "/transfers/a%7fb", "/transfers/a%250ab",
		"/transfers/%c0%ae%c0%ae/admin", "/transfers/%ff",
		// Still encoded after four decodings.
		"/transfers/%2525252541",
	}
	acceptedPaths = []string{
		"/transfers", "/transfers/tr_1/reverse", "/transfers/report%2ejson", "/transfers/.hidden", "/transfers/...",
		"/transfers/..x", "/transfers/x..", "/transfers/100%25", "/transfers/50%25off", "/transfers/%", "/transfers/%2",
		"/transfers/%zz", "/transfers/a%20b", "/transfers/%7euser", "/transfers/%C3%A9t%C3%A9", "/transfers/a;b=c",
		"/transfers/%2541", "/transfers/%252541", "/transfers/%25252541", "/transfers//x",
	}
)

// TestCheckPath: a path that an upstream decoding it once or more could
// resolve outside its route is refused with REQUEST_PATH_INVALID; encoded
// characters that make no dot segment or separator pass.
func TestCheckPath(t *testing.T) {
	for _, p := range refusedPaths {
		err := sidecar.CheckPath(p)
		if !errors.Is(err, &idem.Error{Code: idem.ECodePathInvalid}) {
			t.Errorf("CheckPath(%q) = %v, want %s", p, err, idem.ECodePathInvalid)
		}
		if err != nil && strings.Contains(idem.ErrorMessage(err), "admin") {
			t.Errorf("CheckPath(%q): the message quotes the path: %v", p, err)
		}
	}
	for _, p := range acceptedPaths {
		if err := sidecar.CheckPath(p); err != nil {
			t.Errorf("CheckPath(%q) = %v, want nil", p, err)
		}
	}
}

var escape = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

// decodeOnce decodes every %XX of s, leaving any other '%' as it is.
func decodeOnce(s string) string {
	return escape.ReplaceAllStringFunc(s, func(m string) string {
		b, _ := strconv.ParseUint(m[1:], 16, 8)
		return string([]byte{byte(b)})
	})
}

// insideRoute is CheckPath's contract, written another way: every form of
// p, decoded zero to four times, keeps its separators, has no dot segment
// (cut at ';', split at '/' and '\'), no control character and is UTF-8,
// and a fifth decoding changes nothing.
func insideRoute(p string) bool {
	forms := []string{p}
	for range 5 {
		forms = append(forms, decodeOnce(forms[len(forms)-1]))
	}
	if forms[5] != forms[4] {
		return false
	}
	for i, f := range forms[:5] {
		if i > 0 && (strings.Count(f, "/") != strings.Count(forms[i-1], "/") || strings.Count(f, `\`) != strings.Count(forms[i-1], `\`)) {
			return false
		}
		if !utf8.ValidString(f) || strings.ContainsFunc(f, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return false
		}
		for _, seg := range strings.FieldsFunc(f, func(r rune) bool { return r == '/' || r == '\\' }) {
			seg, _, _ = strings.Cut(seg, ";")
			if seg == "." || seg == ".." {
				return false
			}
		}
	}
	return true
}

// FuzzCheckPath: CheckPath agrees with insideRoute on any input, and a
// path it accepts under a prefix stays under that prefix however often
// an upstream decodes it and resolves its dot segments ('\' taken for
// '/').
func FuzzCheckPath(f *testing.F) {
	for _, p := range append(refusedPaths, acceptedPaths...) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := sidecar.CheckPath(p)
		if err != nil && idem.ErrorCode(err) != idem.ECodePathInvalid {
			t.Fatalf("CheckPath(%q) = %v, want nil or %s", p, err, idem.ECodePathInvalid)
		}
		if want := insideRoute(p); (err == nil) != want {
			t.Fatalf("CheckPath(%q) = %v; the contract says accepted = %v", p, err, want)
		}
		routed := "/transfers/" + p
		if sidecar.CheckPath(routed) != nil {
			return
		}
		for form, i := routed, 0; i < 8; form, i = decodeOnce(form), i+1 {
			if resolved := path.Clean(strings.ReplaceAll(form, `\`, "/")); !strings.HasPrefix(resolved+"/", "/transfers/") {
				t.Fatalf("CheckPath accepted %q, which is %q after %d decodings", routed, resolved, i)
			}
		}
	})
}

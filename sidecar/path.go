package sidecar

import (
	"strings"
	"unicode/utf8"

	"github.com/idemcoord/idem"
)

// maxPathDecodes is how many times CheckPath decodes a path: once for the
// upstream, and more for a chain of proxies and frameworks that each
// decode once. A path that decoding still changes after that many is
// refused, so that every form an upstream could see has been checked.
const maxPathDecodes = 4

// errPathInvalid never quotes the path: it is unauthenticated input.
var errPathInvalid = idem.Errorf(idem.ECodePathInvalid,
	"The path has a dot segment, an encoded '/' or '\\', or a control character, as sent or decoded: an upstream could resolve it outside the route.")

// CheckPath returns 400 REQUEST_PATH_INVALID (an *idem.Error) for a
// request's path (escaped, as received: url.URL.EscapedPath) that an
// upstream could resolve outside the route it matched, and nil for any
// other. The upstream receives the path as it came, and many frameworks
// decode it before they route it: "/transfers/%2e%2e/admin" and
// "/transfers/..%2fadmin" are "/admin" to them. net/http's ServeMux
// redirects a path with an unencoded "." or ".." segment, but matches one
// whose dots or slashes are encoded, so the proxy checks the path itself.
//
// The path is checked as sent and as decoded again and again (%XX, any
// case, an invalid escape left as it is), until decoding changes nothing,
// at most four times ("%252e" is "%2e" after one decoding and
// "." after two); it is refused when decoding still changes it after
// that, or when any of its forms
//
//   - has a dot segment: a segment, between '/' or '\' (which some
//     servers take for '/'), that is "." or ".." before any ";" (Tomcat
//     and Jetty read "..;" as "..");
//   - decodes to a '/' or '\' ("%2f", "%5c"): an encoded separator is a
//     segment boundary to an upstream that decodes first;
//   - has a control character (NUL included, which C-based servers take
//     for the path's end) or is not valid UTF-8 (an overlong "%c0%ae" is
//     "." to some decoders).
//
// Encoded dots that make no dot segment ("/files/report%2ejson") and an
// encoded '%' that decodes to nothing of the above ("/notes/100%25") pass.
func CheckPath(escapedPath string) error {
	s := escapedPath
	for decodes := 0; ; decodes++ {
		if !cleanPathForm(s) {
			return errPathInvalid
		}
		next, changed, separator := unescapePath(s)
		switch {
		case !changed:
			return nil
		case separator, decodes == maxPathDecodes:
			return errPathInvalid
		}
		s = next
	}
}

// cleanPathForm reports whether s, one form of a path, is valid UTF-8
// without control characters or dot segments.
func cleanPathForm(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			if c < 0x20 || c == 0x7f {
				return false
			}
			if c != '/' && c != '\\' {
				continue
			}
		}
		seg := s[start:i]
		if j := strings.IndexByte(seg, ';'); j >= 0 {
			seg = seg[:j]
		}
		if seg == "." || seg == ".." {
			return false
		}
		start = i + 1
	}
	return true
}

// unescapePath decodes every %XX of s with two hex digits and leaves any
// other '%' as it is, as lenient decoders do. It reports whether anything
// was decoded, and whether a decoded byte is '/' or '\'.
func unescapePath(s string) (out string, changed, separator bool) {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s, false, false
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			c := unhex(s[i+1])<<4 | unhex(s[i+2])
			b = append(b, c)
			changed = true
			separator = separator || c == '/' || c == '\\'
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b), changed, separator
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

package idemhttp

import (
	"net/http"
	"strings"
	"time"
)

// PreferWait reads the wait a request states with Prefer: wait=N (RFC 7240
// section 4.3): N seconds, capped at limit. ok is false when the request
// states no wait. Every surface of the service reads the header here: the
// middleware, for how long a request that finds its key in progress is
// held, and a node's server, for how far it moves the request's write
// deadline.
//
// The rules, from RFC 7240 section 2:
//   - Prefer is a comma-separated list of preferences, across all its
//     fields in order; the name wait is matched in any ASCII case, with
//     optional whitespace around '='.
//   - Only the first wait counts. If it is not a well-formed wait (no
//     value, a value that is not digits, anything but parameters after
//     it), the request states no wait; later ones are ignored.
//   - N is delta-seconds: one or more ASCII digits, bare or as a quoted
//     string ("5"), followed by optional ;parameters, which are ignored. No
//     sign, no fraction.
//   - wait=0 is a stated wait of none: the answer comes at once, even where
//     a default wait would hold the request.
//   - A larger N than limit, however many digits, is limit (as RFC 9111
//     reads a delta-seconds too large to represent).
//
// A limit of 0 or less makes every stated wait 0.
func PreferWait(h http.Header, limit time.Duration) (d time.Duration, ok bool) {
	for _, field := range h.Values("Prefer") {
		for len(field) > 0 {
			var elem string
			elem, field = nextElement(field)
			name, rest := cutToken(strings.TrimLeft(elem, " \t"))
			if !strings.EqualFold(name, "wait") {
				continue
			}
			secs, ok := waitValue(rest)
			if !ok {
				return 0, false
			}
			return secondsUpTo(secs, limit), true
		}
	}
	return 0, false
}

// nextElement splits a list at its first comma outside a quoted string.
func nextElement(list string) (elem, rest string) {
	quoted := false
	for i := 0; i < len(list); i++ {
		switch c := list[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return list[:i], list[i+1:]
		}
	}
	return list, ""
}

// waitValue reads what follows the name wait in a preference: BWS "=" BWS
// delta-seconds (bare or quoted), then nothing or ;parameters. It returns
// the digits.
func waitValue(s string) (string, bool) {
	s = strings.TrimLeft(s, " \t")
	s, ok := strings.CutPrefix(s, "=")
	if !ok {
		return "", false
	}
	s = strings.TrimLeft(s, " \t")
	var word string
	if strings.HasPrefix(s, `"`) {
		if word, s, ok = cutQuoted(s); !ok {
			return "", false
		}
	} else {
		word, s = cutToken(s)
	}
	if s = strings.TrimLeft(s, " \t"); s != "" && s[0] != ';' {
		return "", false
	}
	if word == "" || strings.Trim(word, "0123456789") != "" {
		return "", false
	}
	return word, true
}

// cutQuoted splits s after its leading quoted string and returns the
// string's content with its quoted pairs (\x) unescaped; ok is false when
// the string does not end.
func cutQuoted(s string) (content, rest string, ok bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return b.String(), s[i+1:], true
		case c == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// secondsUpTo is digits seconds, at most limit (0 for a limit of 0 or
// less).
func secondsUpTo(digits string, limit time.Duration) time.Duration {
	if limit <= 0 {
		return 0
	}
	most := int64(limit / time.Second)
	var n int64
	for i := 0; i < len(digits); i++ {
		n = n*10 + int64(digits[i]-'0')
		if n > most {
			return limit
		}
	}
	return min(time.Duration(n)*time.Second, limit)
}

// cutToken splits s after its leading RFC 9110 token.
func cutToken(s string) (token, rest string) {
	i := 0
	for i < len(s) && isTokenChar(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

package fingerprint

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrMalformedForm is returned by ParseForm for a body that is not
// application/x-www-form-urlencoded (a bad percent escape).
var ErrMalformedForm = errors.New("fingerprint: malformed form body")

// ParseForm reads an application/x-www-form-urlencoded body into the value
// Hash takes for it: a list of [name, value] pairs, names and values
// percent-decoded ('+' is a space), ordered by name with the pairs of a
// repeated name kept in the order they were sent. So the same fields in
// another order are the same command, and any other difference (a value, a
// repeated name's order, an added field) is another. Empty pairs ("a=1&&b=2")
// are skipped; a pair without '=' has the empty value. Names and values
// must be valid UTF-8 once decoded (ErrInvalidUTF8). drop, when not nil,
// says which names to leave out.
func ParseForm(raw []byte, drop func(name string) bool) ([]any, error) {
	type pair struct{ name, value string }
	var pairs []pair
	for _, part := range strings.Split(string(raw), "&") {
		if part == "" {
			continue
		}
		n, v, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(n)
		if err != nil {
			return nil, ErrMalformedForm
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			return nil, ErrMalformedForm
		}
		if !utf8.ValidString(name) || !utf8.ValidString(value) {
			return nil, ErrInvalidUTF8
		}
		if drop != nil && drop(name) {
			continue
		}
		pairs = append(pairs, pair{name, value})
	}
	slices.SortStableFunc(pairs, func(a, b pair) int { return strings.Compare(a.name, b.name) })
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.name, p.value}
	}
	return out, nil
}

// FormValue returns the first value of name in an
// application/x-www-form-urlencoded body; ok is false when the body has no
// such field or cannot be decoded.
func FormValue(raw []byte, name string) (value string, ok bool) {
	for _, part := range strings.Split(string(raw), "&") {
		n, v, _ := strings.Cut(part, "=")
		if dn, err := url.QueryUnescape(n); err != nil || dn != name {
			continue
		}
		dv, err := url.QueryUnescape(v)
		return dv, err == nil
	}
	return "", false
}

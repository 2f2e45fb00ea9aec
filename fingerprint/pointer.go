package fingerprint

import (
	"strconv"
	"strings"
)

// pointerTokens splits an RFC 6901 JSON pointer ("/a/b~1c") into its
// reference tokens ("a", "b/c"); a string without a leading '/' is one
// token, a top-level member's name.
func pointerTokens(p string) []string {
	if !strings.HasPrefix(p, "/") {
		return []string{p}
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks
}

// Lookup returns the value a JSON pointer (or a top-level member's name)
// refers to in an object ParseObject returned.
func Lookup(doc map[string]any, pointer string) (any, bool) {
	var v any = doc
	for _, tok := range pointerTokens(pointer) {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) || strconv.Itoa(i) != tok {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// Remove deletes what a JSON pointer (or a top-level member's name) refers
// to from an object ParseObject returned: a member of an object, or an
// element of an array (the later ones move up). A pointer to nothing
// changes nothing; the empty pointer (the whole document) is not removed.
func Remove(doc map[string]any, pointer string) {
	toks := pointerTokens(pointer)
	if len(toks) == 0 || pointer == "" {
		return
	}
	parent, ok := Lookup(doc, "/"+strings.Join(escapeTokens(toks[:len(toks)-1]), "/"))
	if len(toks) == 1 {
		parent, ok = doc, true
	}
	if !ok {
		return
	}
	last := toks[len(toks)-1]
	switch c := parent.(type) {
	case map[string]any:
		delete(c, last)
	case []any:
		// An array is shared by its parent: rebuild it there.
		i, err := strconv.Atoi(last)
		if err != nil || i < 0 || i >= len(c) || strconv.Itoa(i) != last {
			return
		}
		grand, _ := Lookup(doc, "/"+strings.Join(escapeTokens(toks[:len(toks)-2]), "/"))
		if len(toks) == 2 {
			grand = doc
		}
		shorter := append(append([]any{}, c[:i]...), c[i+1:]...)
		setChild(grand, toks[len(toks)-2], shorter)
	}
}

func setChild(parent any, tok string, v any) {
	switch c := parent.(type) {
	case map[string]any:
		c[tok] = v
	case []any:
		if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(c) {
			c[i] = v
		}
	}
}

func escapeTokens(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
	}
	return out
}

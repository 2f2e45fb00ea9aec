package fingerprint_test

import (
	"errors"
	"net/url"
	"reflect"
	"testing"

	"github.com/idemcoord/idem/fingerprint"
)

func TestParseForm(t *testing.T) {
	got, err := fingerprint.ParseForm([]byte("b=2&a=x+y&b=1&&c&a%5B0%5D=%E2%82%AC"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{[]any{"a", "x y"}, []any{"a[0]", "€"}, []any{"b", "2"}, []any{"b", "1"}, []any{"c", ""}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseForm = %v, want %v", got, want)
	}
	dropped, err := fingerprint.ParseForm([]byte("a=1&ts=9&b=2"), func(n string) bool { return n == "ts" })
	if err != nil || !reflect.DeepEqual(dropped, []any{[]any{"a", "1"}, []any{"b", "2"}}) {
		t.Errorf("with a dropped name: %v, %v", dropped, err)
	}
	for _, bad := range []string{"a=%zz", "%=1"} {
		if _, err := fingerprint.ParseForm([]byte(bad), nil); !errors.Is(err, fingerprint.ErrMalformedForm) {
			t.Errorf("%q: %v, want ErrMalformedForm", bad, err)
		}
	}
	if _, err := fingerprint.ParseForm([]byte("a=%ff"), nil); !errors.Is(err, fingerprint.ErrInvalidUTF8) {
		t.Errorf("invalid UTF-8: %v", err)
	}
	if v, ok := fingerprint.FormValue([]byte("x=1&key=k%201&key=2"), "key"); !ok || v != "k 1" {
		t.Errorf("FormValue = %q, %v", v, ok)
	}
	if _, ok := fingerprint.FormValue([]byte("x=1"), "key"); ok {
		t.Error("FormValue found a missing field")
	}
}

func TestPointers(t *testing.T) {
	doc, err := fingerprint.ParseObject([]byte(`{"a":{"b/c":1,"t~":2},"l":[1,2,3],"top":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := fingerprint.Lookup(doc, "/a/b~1c"); !ok || v != fingerprint.Number("1") {
		t.Errorf("Lookup /a/b~1c = %v, %v", v, ok)
	}
	if _, ok := fingerprint.Lookup(doc, "/l/01"); ok {
		t.Error("Lookup accepted a leading zero")
	}
	fingerprint.Remove(doc, "/a/t~0")
	fingerprint.Remove(doc, "/l/1")
	fingerprint.Remove(doc, "top")
	fingerprint.Remove(doc, "/nothing/here")
	want := map[string]any{"a": map[string]any{"b/c": fingerprint.Number("1")}, "l": []any{fingerprint.Number("1"), fingerprint.Number("3")}}
	if !reflect.DeepEqual(doc, want) {
		t.Errorf("after Remove: %v, want %v", doc, want)
	}
}

// FuzzParseForm: no input panics; what parses hashes; a form and the same
// pairs encoded again by net/url in another order are the same command.
func FuzzParseForm(f *testing.F) {
	for _, s := range []string{"", "a=1&b=2", "b=2&a=1&a=0", "x=%E2%82%AC+y", "a=%zz", "&&=&", "metadata%5Bk%5D=v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pairs, err := fingerprint.ParseForm([]byte(s), nil)
		if err != nil {
			return
		}
		h1, err := fingerprint.Hash("op", map[string]any{"body": pairs})
		if err != nil {
			t.Fatalf("parsed form %q does not hash: %v", s, err)
		}
		// Re-encode in reverse order of names (repeated names in order).
		var enc []string
		for i := len(pairs) - 1; i >= 0; {
			name := pairs[i].([]any)[0].(string)
			j := i
			for j >= 0 && pairs[j].([]any)[0].(string) == name {
				j--
			}
			for k := j + 1; k <= i; k++ {
				p := pairs[k].([]any)
				enc = append(enc, url.QueryEscape(p[0].(string))+"="+url.QueryEscape(p[1].(string)))
			}
			i = j
		}
		again := ""
		for i, e := range enc {
			if i > 0 {
				again += "&"
			}
			again += e
		}
		pairs2, err := fingerprint.ParseForm([]byte(again), nil)
		if err != nil {
			t.Fatalf("re-encoded %q of %q: %v", again, s, err)
		}
		h2, _ := fingerprint.Hash("op", map[string]any{"body": pairs2})
		if h1 != h2 {
			t.Fatalf("%q and %q hash differently", s, again)
		}
	})
}

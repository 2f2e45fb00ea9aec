package fingerprint

import (
	"strings"
	"testing"
)

func TestHashIsOrderIndependentAndVersioned(t *testing.T) {
	a, err := Hash("create_payment", map[string]any{"amountMinor": 1000, "currency": "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Hash("create_payment", map[string]any{"currency": "EUR", "amountMinor": 1000})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("Hash depends on map order: %s != %s", a, b)
	}
	if !strings.HasPrefix(a, "v1:") || len(a) != len("v1:")+64 {
		t.Errorf("Hash = %q, want v1: prefix and 64 hex digits", a)
	}
	c, _ := Hash("create_refund", map[string]any{"amountMinor": 1000, "currency": "EUR"})
	if c == a {
		t.Error("operation name is not part of the hash")
	}
	d, _ := Hash("create_payment", map[string]any{"amountMinor": 10000, "currency": "EUR"})
	if d == a {
		t.Error("a different amount hashes the same")
	}
}

func TestCanonicalIsRFC8785(t *testing.T) {
	got, err := Canonical("op", map[string]any{"b": "x", "a": 1.0, "c": []any{"é", 2}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"a":1,"b":"x","c":["é",2],"operation":"op"}`
	if string(got) != want {
		t.Errorf("Canonical = %s, want %s", got, want)
	}
}

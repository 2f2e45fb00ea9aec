package fingerprint_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idemcoord/idem/fingerprint"
)

// TestRawHash: a raw hash is "r1:" and SHA-256 in hex, the same for the
// same inputs, and different whenever the operation, an input or the body
// differ, however their bytes could be cut apart or run together.
func TestRawHash(t *testing.T) {
	base := fingerprint.RawHash("op", []byte(`{"a":1}`), "Api-Version", "1")
	if !strings.HasPrefix(base, fingerprint.RawPrefix) {
		t.Fatalf("raw hash %q lacks %q", base, fingerprint.RawPrefix)
	}
	if b, err := hex.DecodeString(strings.TrimPrefix(base, fingerprint.RawPrefix)); err != nil || len(b) != 32 {
		t.Fatalf("raw hash %q is not SHA-256 in hex", base)
	}
	if again := fingerprint.RawHash("op", []byte(`{"a":1}`), "Api-Version", "1"); again != base {
		t.Errorf("one request, two raw hashes: %q, %q", base, again)
	}
	if fingerprint.VersionOf(base) != 0 {
		t.Errorf("a raw hash reads as a request hash of version %d", fingerprint.VersionOf(base))
	}
	others := map[string]string{
		"operation":          fingerprint.RawHash("op2", []byte(`{"a":1}`), "Api-Version", "1"),
		"body":               fingerprint.RawHash("op", []byte(`{"a": 1}`), "Api-Version", "1"),
		"input value":        fingerprint.RawHash("op", []byte(`{"a":1}`), "Api-Version", "2"),
		"input name":         fingerprint.RawHash("op", []byte(`{"a":1}`), "Api-Versio", "n1"),
		"empty input":        fingerprint.RawHash("op", []byte(`{"a":1}`), "Api-Version", "1", "X", ""),
		"no input":           fingerprint.RawHash("op", []byte(`{"a":1}`)),
		"input into body":    fingerprint.RawHash("op", []byte(`1{"a":1}`), "Api-Version", ""),
		"operation into one": fingerprint.RawHash("opApi-Version", []byte(`{"a":1}`), "", "1"),
	}
	seen := map[string]string{base: "base"}
	for name, h := range others {
		if prev, ok := seen[h]; ok {
			t.Errorf("%s hashes like %s", name, prev)
		}
		seen[h] = name
	}
}

// TestRawHashEncoding pins what is hashed, for bodies hashed from the
// stack and from the heap alike: the operation, the number of input pairs,
// each input and the body, each but the count after its length as a
// uvarint.
func TestRawHashEncoding(t *testing.T) {
	for _, n := range []int{0, 1, 900, 1023, 1024, 5000} {
		body := []byte(strings.Repeat("x", n))
		var b []byte
		field := func(s string) {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		field("op")
		b = binary.AppendUvarint(b, 2)
		for _, s := range []string{"Api-Version", "1", "Content-Type", "application/json"} {
			field(s)
		}
		field(string(body))
		sum := sha256.Sum256(b)
		want := fingerprint.RawPrefix + hex.EncodeToString(sum[:])
		if got := fingerprint.RawHash("op", body, "Api-Version", "1", "Content-Type", "application/json"); got != want {
			t.Errorf("body of %d bytes: raw hash %s, want %s", n, got, want)
		}
	}
}

package idem_test

import (
	"strings"
	"testing"

	"github.com/idemcoord/idem"
)

// FuzzValidKey checks the idempotency key rule: a key is accepted exactly
// when it is 1 to 255 bytes of visible ASCII (so never a control, a space,
// invalid UTF-8 or a non-NFC sequence) other than the dot segments "." and
// "..".
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"k1", "a b", "", strings.Repeat("k", 255), strings.Repeat("k", 256), "\x00", "\xff", "caf\u00e9", "~!", "\x7f", ".", "..", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) >= 1 && len(key) <= 255 && key != "." && key != ".."
		for i := 0; i < len(key); i++ {
			want = want && key[i] >= 0x21 && key[i] <= 0x7e
		}
		if got := idem.ValidKey(key); got != want {
			t.Fatalf("ValidKey(%q) = %v, want %v", key, got, want)
		}
	})
}

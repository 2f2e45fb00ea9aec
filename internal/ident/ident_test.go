package ident

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, s string
		want    error
	}{
		{"ascii", "invoice-7781", nil},
		{"nfc", "caf\u00e9", nil},
		{"cjk", "\u6ce8\u6587-1", nil},
		{"empty", "", nil},
		{"nfd", "cafe\u0301", ErrNotNFC},
		{"nul", "a\x00b", ErrControl},
		{"tab", "a\tb", ErrControl},
		{"del", "a\x7fb", ErrControl},
		{"c1", "a\u0085b", ErrControl},
		{"c1 csi", "a\u009bb", ErrControl},
		{"replacement", "a\ufffdb", ErrControl},
		{"invalid utf-8", "a\xffb", ErrInvalidUTF8},
		{"rlo", "inv\u202eoice", ErrBidi},
		{"lre", "\u202ax", ErrBidi},
		{"isolate", "x\u2066y", ErrBidi},
		{"pdi", "x\u2069", ErrBidi},
		{"lrm", "x\u200e", ErrBidi},
		{"rlm", "x\u200f", ErrBidi},
		{"alm", "x\u061c", ErrBidi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Check(tc.s); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Errorf("Check(%q) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}

// FuzzCheck checks that an accepted identifier is NFC, valid UTF-8 and free of
// the rejected characters, and that Check never panics.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"acc_1", "caf\u00e9", "cafe\u0301", "\u202e", "\x00", "\u0085", "\xff", "\u1e9b\u0323"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Check(s) != nil {
			return
		}
		if !norm.NFC.IsNormalString(s) {
			t.Fatalf("accepted non-NFC %q", s)
		}
		for _, r := range s {
			if r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == 0xfffd || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f {
				t.Fatalf("accepted %q holding %U", s, r)
			}
		}
	})
}

func TestCheckTenant(t *testing.T) {
	for _, tc := range []struct {
		name, s string
		want    error
	}{
		{"plain", "tenant-a", nil},
		{"dotted", "acme.eu_1:prod", nil},
		{"email-like", "ops@acme.example", nil},
		{"nfc", "caf\u00e9", nil},
		{"longest", strings.Repeat("t", MaxTenantLen), nil},
		{"empty", "", ErrTenant},
		{"too long", strings.Repeat("t", MaxTenantLen+1), ErrTenant},
		{"a second pair", "tenant-a,x=y", ErrTenant},
		{"comma", "a,b", ErrTenant},
		{"equals", "a=b", ErrTenant},
		{"space", "tenant a", ErrTenant},
		{"tab", "a\tb", ErrTenant},
		{"no-break space", "a\u00a0b", ErrTenant},
		{"ideographic space", "a\u3000b", ErrTenant},
		{"nul", "a\x00b", ErrControl},
		{"nfd", "cafe\u0301", ErrNotNFC},
		{"rlo", "inv\u202eoice", ErrBidi},
		{"invalid utf-8", "a\xffb", ErrInvalidUTF8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CheckTenant(tc.s); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Errorf("CheckTenant(%q) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}

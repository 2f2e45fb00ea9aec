// Package ident checks identifiers a client chooses (account ids, merchant
// references, owners, resource ids) and the tenant names an operator
// configures: text that is stored, compared byte for byte and shown back to
// people.
//
// An identifier must be valid UTF-8 in Unicode Normalization Form C, and must
// not hold control characters (C0, DEL, C1), the replacement character
// U+FFFD, or the invisible direction marks and overrides that make text
// display differently from what it is (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069). Identifiers are rejected, never rewritten:
// NFC and NFD spellings of one reference would otherwise be two keys, and a
// silently normalised reference would no longer be the bytes the client
// sent.
package ident

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Reasons Check rejects an identifier, matched with errors.Is.
var (
	ErrInvalidUTF8 = errors.New("ident: not valid UTF-8")
	ErrControl     = errors.New("ident: control or replacement character")
	ErrBidi        = errors.New("ident: bidirectional control character")
	ErrNotNFC      = errors.New("ident: not in Unicode Normalization Form C")
	// ErrTenant is CheckTenant's reason for a name that is empty, longer
	// than MaxTenantLen bytes, or holds white space, ',' or '='.
	ErrTenant = errors.New("ident: a tenant name is 1 to 128 bytes without white space, ',' or '='")
)

// MaxTenantLen is the longest tenant name CheckTenant accepts, in bytes.
const MaxTenantLen = 128

// Check returns nil if s is an acceptable identifier (see the package
// documentation), or one of the package's errors. The empty string passes;
// callers check presence and length.
func Check(s string) error {
	if !utf8.ValidString(s) {
		return ErrInvalidUTF8
	}
	ascii := true
	for _, r := range s {
		switch {
		case r < 0x20, r >= 0x7f && r <= 0x9f, r == utf8.RuneError:
			return ErrControl
		case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return ErrBidi
		}
		if r >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !norm.NFC.IsNormalString(s) {
		return ErrNotNFC
	}
	return nil
}

// CheckTenant returns nil if s is an acceptable tenant name, or one of the
// package's errors. A tenant name is an identifier (Check) of 1 to
// MaxTenantLen bytes without white space, ',' or '=': those separate the
// token=tenant pairs tenants are configured in (idemd's tokens file,
// IDEM_AUTH_TOKENS), so a line such as "tok=tenant-a,x=y" is refused rather
// than read as a tenant named "tenant-a,x=y".
func CheckTenant(s string) error {
	if s == "" || len(s) > MaxTenantLen || strings.ContainsAny(s, ",=") || strings.ContainsFunc(s, unicode.IsSpace) {
		return ErrTenant
	}
	return Check(s)
}

package paymentsnode

import (
	"strings"
	"testing"
)

// TestValidPaymentID: GET /payments/{id} refuses, before any SQL, an id
// that no payment can have: empty, longer than 128 bytes, or with anything
// but visible ASCII (NUL, invalid UTF-8 and controls would reach
// PostgreSQL as errors that are not the client's to see).
func TestValidPaymentID(t *testing.T) {
	for id, want := range map[string]bool{
		"pay_0123abcd": true, strings.Repeat("p", 128): true, "~!": true,
		"": false, strings.Repeat("p", 129): false, "pay\x00": false, "pay\xff": false, "pay 1": false, "pay\u202e": false, "pay\n": false,
	} {
		if got := validPaymentID(id); got != want {
			t.Errorf("validPaymentID(%q) = %v, want %v", id, got, want)
		}
	}
}

package region

import (
	"crypto/sha256"
	"testing"
)

// TestTenantOf: a token resolves to its tenant only when it is exactly a
// configured token; prefixes, extensions and other lengths resolve to none.
// Only digests are kept.
func TestTenantOf(t *testing.T) {
	s := &Server{}
	for token, tenant := range map[string]string{"tok-a": "tenant-a", "a-much-longer-token-b": "tenant-b"} {
		s.tokens = append(s.tokens, tokenDigest{sum: sha256.Sum256([]byte(token)), name: tenant})
	}
	for token, want := range map[string]string{
		"tok-a": "tenant-a", "a-much-longer-token-b": "tenant-b",
		"tok-": "", "tok-ab": "", "TOK-A": "", "": "", "a-much-longer-token-": "",
	} {
		if got := s.tenantOf(token); got != want {
			t.Errorf("tenantOf(%q) = %q, want %q", token, got, want)
		}
	}
}

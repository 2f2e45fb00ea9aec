package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/ident"
)

// TestReadTokensFile: a tokens file gives a token -> tenant map; a line
// whose tenant is not a tenant name (a second pair after a comma, white
// space, '=') stops the read with an error that names the line and
// never its content.
func TestReadTokensFile(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		t.Helper()
		p := filepath.Join(dir, "tokens")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	m, warn, err := ReadTokensFile(write("# dev tokens\n\nsecret-tok-a=tenant-a\n  secret-tok-b = acme.eu_1  \r\n"))
	if err != nil || warn != "" {
		t.Fatalf("ReadTokensFile = %v, %q, %v", m, warn, err)
	}
	if len(m) != 2 || m["secret-tok-a"] != "tenant-a" || m["secret-tok-b"] != "acme.eu_1" {
		t.Errorf("tokens = %v", m)
	}

	for _, tc := range []struct {
		name, content string
		line          string
		tenant        bool // refused for its tenant (errors.Is ident.ErrTenant)
	}{
		{"a second pair after a comma", "secret-tok-a=tenant-a\nsecret-tok-b=tenant-b,x=y\n", "line 2", true},
		{"a comma list on one line", "secret-tok-a=tenant-a,secret-tok-b=tenant-b\n", "line 1", true},
		{"a second '='", "# a comment\nsecret-tok-a=tenant=a\n", "line 2", true},
		{"a space inside", "secret-tok-a=tenant a\n", "line 1", true},
		{"a trailing comment", "secret-tok-a=tenant-a # dev\n", "line 1", true},
		{"a control character", "secret-tok-a=tenant\x01a\n", "line 1", false},
		{"no tenant", "\n\n\nsecret-tok-a=\n", "line 4", false},
		{"no '='", "secret-tok-a\n", "line 1", false},
		{"a token twice", "secret-tok-a=tenant-a\nsecret-tok-a=tenant-b\n", "line 2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, err := ReadTokensFile(write(tc.content))
			if err == nil {
				t.Fatalf("accepted: %v", m)
			}
			if !strings.Contains(err.Error(), tc.line) {
				t.Errorf("error %q does not name %s", err, tc.line)
			}
			if strings.Contains(err.Error(), "secret-tok") || strings.Contains(err.Error(), "tenant-b") {
				t.Errorf("error %q echoes the file's content", err)
			}
			if got := errors.Is(err, ident.ErrTenant); tc.tenant && !got {
				t.Errorf("error %q does not match ident.ErrTenant", err)
			}
		})
	}
}

// TestReadSecretsFile: a secrets file gives its secrets in order, skipping
// blank lines and comments; a line with a space, a secret given twice or a
// file with none stops the read with an error that never quotes a secret;
// a file others may read comes with a warning.
func TestReadSecretsFile(t *testing.T) {
	dir := t.TempDir()
	write := func(content string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, "secrets")
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, warn, err := ReadSecretsFile(write("# rotation under way\n\n  whsec_old  \r\nwhsec_new\n", 0o600))
	if err != nil || warn != "" || len(got) != 2 || got[0] != "whsec_old" || got[1] != "whsec_new" {
		t.Errorf("ReadSecretsFile = %q, %q, %v", got, warn, err)
	}
	if _, warn, err := ReadSecretsFile(write("whsec_a\n", 0o644)); err != nil || warn == "" {
		t.Errorf("a file others may read: warn %q, %v", warn, err)
	}
	for _, content := range []string{"", "# nothing\n\n", "whsec_a b\n", "whsec_same\nwhsec_same\n"} {
		_, _, err := ReadSecretsFile(write(content, 0o600))
		if err == nil {
			t.Errorf("ReadSecretsFile(%q) accepted", content)
		} else if strings.Contains(err.Error(), "whsec_") {
			t.Errorf("the error quotes a secret: %v", err)
		}
	}
	if _, _, err := ReadSecretsFile(filepath.Join(dir, "absent")); err == nil {
		t.Error("a missing file accepted")
	}
}

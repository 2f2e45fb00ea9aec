package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// newTokens makes one development token per tenant.
func newTokens(tenants []string) (map[string]string, error) {
	tokens := make(map[string]string, len(tenants))
	for _, t := range tenants {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("cluster: token: %w", err)
		}
		tokens[t] = "dev_" + hex.EncodeToString(b[:])
	}
	return tokens, nil
}

// secretFiles are the files, in <StateDir>/secrets, that hand the
// cluster's secrets to its processes: secrets are never put on a command
// line, which every local user can read.
type secretFiles struct {
	tokens           string // idemd's --auth-tokens-file
	adminTokens      string // idemd's --admin-tokens-file
	adminToken       string // that token alone, for idemctl records --admin-token-file
	providerAPIKey   string // "" without the provider
	providerAdminKey string
	adminKey         string // the admin key itself, for Info
}

// writeSecrets writes the tokens file, the nodes' admin tokens file (one
// new random token, named operator) with that token alone beside it and,
// with the provider, its API and admin keys (new random ones) into
// dir/secrets, a directory only the owner may enter, each file with mode
// 0600.
func writeSecrets(dir string, tokens map[string]string, withProvider bool) (secretFiles, error) {
	sd := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(sd, 0o700); err != nil {
		return secretFiles{}, fmt.Errorf("cluster: secrets directory: %w", err)
	}
	if err := os.Chmod(sd, 0o700); err != nil {
		return secretFiles{}, fmt.Errorf("cluster: secrets directory: %w", err)
	}
	var b strings.Builder
	b.WriteString("# idemd bearer tokens (--auth-tokens-file): one token=tenant per line\n")
	for _, tenant := range slices.Sorted(maps.Keys(tokens)) {
		b.WriteString(tokens[tenant] + "=" + tenant + "\n")
	}
	sf := secretFiles{tokens: filepath.Join(sd, "auth-tokens")}
	if err := writeFileAtomic(sf.tokens, []byte(b.String())); err != nil {
		return secretFiles{}, err
	}
	var adm [24]byte
	if _, err := rand.Read(adm[:]); err != nil {
		return secretFiles{}, fmt.Errorf("cluster: admin token: %w", err)
	}
	admin := "adm_" + hex.EncodeToString(adm[:])
	sf.adminTokens, sf.adminToken = filepath.Join(sd, "admin-tokens"), filepath.Join(sd, "admin-token")
	if err := writeFileAtomic(sf.adminTokens, []byte("# idemd admin tokens (--admin-tokens-file): one token=name per line\n"+admin+"=operator\n")); err != nil {
		return secretFiles{}, err
	}
	if err := writeFileAtomic(sf.adminToken, []byte(admin+"\n")); err != nil {
		return secretFiles{}, err
	}
	if !withProvider {
		return sf, nil
	}
	keys := make([]string, 2)
	for i := range keys {
		var r [24]byte
		if _, err := rand.Read(r[:]); err != nil {
			return secretFiles{}, fmt.Errorf("cluster: provider key: %w", err)
		}
		keys[i] = hex.EncodeToString(r[:])
	}
	sf.providerAPIKey = filepath.Join(sd, "provider-api-key")
	sf.providerAdminKey = filepath.Join(sd, "provider-admin-key")
	sf.adminKey = "adm_" + keys[1]
	if err := writeFileAtomic(sf.providerAPIKey, []byte("api_"+keys[0]+"\n")); err != nil {
		return secretFiles{}, err
	}
	if err := writeFileAtomic(sf.providerAdminKey, []byte(sf.adminKey+"\n")); err != nil {
		return secretFiles{}, err
	}
	return sf, nil
}

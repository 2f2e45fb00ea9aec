package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/idemcoord/idem/internal/ident"
)

// ReadTokensFile reads bearer tokens from the file at path: one
// token=tenant per line; blank lines and lines starting with # are
// ignored, and spaces around the token and the tenant are trimmed. A token
// may appear once, and a tenant must be a tenant name (ident.CheckTenant:
// no white space, ',' or '=' among other rules). Errors name the line,
// never its content (it is a secret). warn is non-empty when the file is
// readable by its group or others, which the caller should log.
func ReadTokensFile(path string) (tokens map[string]string, warn string, err error) {
	b, warn, err := readSecretFile(path)
	if err != nil {
		return nil, "", err
	}
	if tokens, err = parseTokensFile(path, b); err != nil {
		return nil, "", err
	}
	return tokens, warn, nil
}

// parseTokensFile parses the content b of the tokens file at path (named in
// errors) with the rules of ReadTokensFile.
func parseTokensFile(path string, b []byte) (map[string]string, error) {
	tokens := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		token, tenant, ok := strings.Cut(line, "=")
		token, tenant = strings.TrimSpace(token), strings.TrimSpace(tenant)
		if !ok || token == "" || tenant == "" {
			return nil, fmt.Errorf("tokens file %s, line %d: want token=tenant", path, n)
		}
		if err := ident.CheckTenant(tenant); err != nil {
			return nil, fmt.Errorf("tokens file %s, line %d: the tenant is not a valid tenant name: %w", path, n, err)
		}
		if _, dup := tokens[token]; dup {
			return nil, fmt.Errorf("tokens file %s, line %d: token given twice", path, n)
		}
		tokens[token] = tenant
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return tokens, nil
}

// ReadKeyFile reads a key (an API key, for example) from the file at path:
// its content without surrounding white space, which must not be empty.
// warn is as for ReadTokensFile.
func ReadKeyFile(path string) (key, warn string, err error) {
	b, warn, err := readSecretFile(path)
	if err != nil {
		return "", "", err
	}
	key = strings.TrimSpace(string(b))
	if key == "" {
		return "", "", fmt.Errorf("key file %s is empty", path)
	}
	if strings.ContainsAny(key, " \t\r\n") {
		return "", "", fmt.Errorf("key file %s: want the key on one line, without spaces", path)
	}
	return key, warn, nil
}

// ReadSecretsFile reads secrets from the file at path, one a line (a
// webhook route's signing secrets: two while a rotation is under way);
// blank lines and lines starting with # are skipped, and spaces around a
// secret trimmed. A secret holds no white space, a secret appears once,
// and the file holds at least one. Errors name the line, never its
// content. warn is as for ReadTokensFile.
func ReadSecretsFile(path string) (secrets []string, warn string, err error) {
	b, warn, err := readSecretFile(path)
	if err != nil {
		return nil, "", err
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, " \t") {
			return nil, "", fmt.Errorf("secrets file %s, line %d: want one secret, without spaces", path, n)
		}
		for _, s := range secrets {
			if s == line {
				return nil, "", fmt.Errorf("secrets file %s, line %d: secret given twice", path, n)
			}
		}
		secrets = append(secrets, line)
	}
	if err := sc.Err(); err != nil {
		return nil, "", fmt.Errorf("secrets file %s: %w", path, err)
	}
	if len(secrets) == 0 {
		return nil, "", fmt.Errorf("secrets file %s holds no secret", path)
	}
	return secrets, warn, nil
}

// readSecretFile reads a file holding secrets and checks its permissions.
func readSecretFile(path string) ([]byte, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, "", fmt.Errorf("secret file %s is not a regular file", path)
	}
	var warn string
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		warn = fmt.Sprintf("secret file %s has mode %v: other users may read it; chmod 600 it", path, perm)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, "", fmt.Errorf("secret file: %w", err)
	}
	return b, warn, nil
}

// KeyFromFileOrEnv returns the key held in file, whose flag is flagName,
// or, without a file, envValue, the value of the environment variable
// envName (trimmed; "" when unset). Setting both is an error. warn is as
// for ReadTokensFile.
func KeyFromFileOrEnv(flagName, file, envName, envValue string) (key, warn string, err error) {
	envValue = strings.TrimSpace(envValue)
	switch {
	case file != "" && envValue != "":
		return "", "", fmt.Errorf("both %s and %s are set; set one", flagName, envName)
	case file != "":
		key, warn, err := ReadKeyFile(file)
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", flagName, err)
		}
		return key, warn, nil
	}
	return envValue, "", nil
}

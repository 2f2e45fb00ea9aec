// Package cli holds what the commands share: flags that fall back to IDEM_*
// environment variables, token lists, and files holding secrets.
package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/idemcoord/idem/internal/ident"
)

// EnvName returns the environment variable of a flag: IDEM_ + upper case,
// dashes as underscores ("database-url" -> "IDEM_DATABASE_URL").
func EnvName(flagName string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag of fs that was not given on the command line from
// its environment variable, when that is set. getenv is os.Getenv in
// production.
func ApplyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v := getenv(EnvName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	return err
}

// ParseTokens parses "token=tenant,token2=tenant2" (the IDEM_AUTH_TOKENS
// form) into a token -> tenant map, with the rules of ReadTokensFile:
// spaces around a token and a tenant are trimmed, a token may appear once,
// and a tenant must be a tenant name (ident.CheckTenant). Errors name the
// pair's position, never its content (it is a secret).
func ParseTokens(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for i, pair := range strings.Split(s, ",") {
		token, tenant, ok := strings.Cut(pair, "=")
		token, tenant = strings.TrimSpace(token), strings.TrimSpace(tenant)
		if !ok || token == "" || tenant == "" {
			return nil, fmt.Errorf("auth tokens: pair %d is not token=tenant", i+1)
		}
		if err := ident.CheckTenant(tenant); err != nil {
			return nil, fmt.Errorf("auth tokens: pair %d: the tenant is not a valid tenant name: %w", i+1, err)
		}
		if _, dup := out[token]; dup {
			return nil, fmt.Errorf("auth tokens: pair %d repeats a token", i+1)
		}
		out[token] = tenant
	}
	return out, nil
}

// ParsePairs parses "a=b,c=d" into a map.
func ParsePairs(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q is not name=value", pair)
		}
		out[k] = v
	}
	return out, nil
}

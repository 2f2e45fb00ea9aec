package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// parseWith parses args with env as the environment, logging into a buffer.
func parseWith(t *testing.T, args []string, env map[string]string) (*Main, string, error) {
	t.Helper()
	var log bytes.Buffer
	m := NewMain()
	m.logger = slog.New(slog.NewTextHandler(&log, nil))
	err := m.ParseFlags(append([]string{"--database-url", "postgres://x"}, args...), func(k string) string { return env[k] })
	return m, log.String(), err
}

// TestSecretsNeverFlags: bearer tokens and the provider's API key come from
// files (or environment variables), never from the command line, which any
// local user can read in /proc/<pid>/cmdline.
func TestSecretsNeverFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}

	for _, args := range [][]string{{"--auth-tokens", "tok=tenant-a"}, {"-auth-tokens=tok=tenant-a"}} {
		_, _, err := parseWith(t, args, nil)
		if err == nil || !strings.Contains(err.Error(), "--auth-tokens-file") || strings.Contains(err.Error(), "tok=tenant-a") {
			t.Errorf("%q: %v, want a refusal pointing to --auth-tokens-file that does not echo the token", args, err)
		}
	}

	tokens := write("tokens", "# dev tokens\n\ntok-a=tenant-a\n  tok-b = tenant-b  \n", 0o600)
	m, log, err := parseWith(t, []string{"--auth-tokens-file", tokens}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.AuthTokens) != 2 || m.AuthTokens["tok-a"] != "tenant-a" || m.AuthTokens["tok-b"] != "tenant-b" {
		t.Errorf("tokens = %v", m.AuthTokens)
	}
	if strings.Contains(log, "other users may read") {
		t.Errorf("a 0600 tokens file was warned about:\n%s", log)
	}
	// The file from IDEM_AUTH_TOKENS_FILE; a readable file is warned about.
	open := write("open-tokens", "tok-c=tenant-c\n", 0o644)
	m, log, err = parseWith(t, nil, map[string]string{"IDEM_AUTH_TOKENS_FILE": open})
	if err != nil || m.AuthTokens["tok-c"] != "tenant-c" {
		t.Errorf("IDEM_AUTH_TOKENS_FILE: %v, %v", m.AuthTokens, err)
	}
	if !strings.Contains(log, "other users may read") {
		t.Errorf("no warning for a tokens file of mode 0644:\n%s", log)
	}
	// IDEM_AUTH_TOKENS keeps working; both at once is a mistake.
	m, _, err = parseWith(t, nil, map[string]string{"IDEM_AUTH_TOKENS": "tok-d=tenant-d"})
	if err != nil || m.AuthTokens["tok-d"] != "tenant-d" {
		t.Errorf("IDEM_AUTH_TOKENS: %v, %v", m.AuthTokens, err)
	}
	if _, _, err := parseWith(t, []string{"--auth-tokens-file", tokens}, map[string]string{"IDEM_AUTH_TOKENS": "x=y"}); err == nil {
		t.Error("--auth-tokens-file and IDEM_AUTH_TOKENS together were accepted")
	}
	// A malformed line is named by its number, its content never echoed.
	bad := write("bad", "tok-a=tenant-a\nsecret-without-tenant\n", 0o600)
	if _, _, err := parseWith(t, []string{"--auth-tokens-file", bad}, nil); err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), "secret-without") {
		t.Errorf("malformed tokens file: %v, want an error naming line 2 without its content", err)
	}
	if _, _, err := parseWith(t, nil, map[string]string{"IDEM_AUTH_TOKENS": "a=b,secret-alone"}); err == nil || strings.Contains(err.Error(), "secret-alone") {
		t.Errorf("malformed IDEM_AUTH_TOKENS: %v, want an error without its content", err)
	}
	// So is a line whose tenant is not a tenant name: "tok=tenant-a,x=y"
	// would otherwise make a tenant named "tenant-a,x=y".
	pairs := write("pairs", "tok-a=tenant-a\nsecret-tok-b=tenant-b,x=y\n", 0o600)
	if _, _, err := parseWith(t, []string{"--auth-tokens-file", pairs}, nil); err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), "secret-tok-b") {
		t.Errorf("tokens file with a tenant %q: %v, want an error naming line 2 without its content", "tenant-b,x=y", err)
	}
	if _, _, err := parseWith(t, nil, map[string]string{"IDEM_AUTH_TOKENS": "a=b,secret-tok=tenant=c"}); err == nil || strings.Contains(err.Error(), "secret-tok") {
		t.Errorf("IDEM_AUTH_TOKENS with a tenant %q: %v, want an error without its content", "tenant=c", err)
	}

	// The provider's API key: from a file or IDEM_PROVIDER_API_KEY.
	key := write("provider-key", "pk_0123456789\n", 0o600)
	if m, _, err = parseWith(t, []string{"--provider-api-key-file", key}, nil); err != nil || m.ProviderAPIKey != "pk_0123456789" {
		t.Errorf("--provider-api-key-file: %q, %v", m.ProviderAPIKey, err)
	}
	if m, _, err = parseWith(t, nil, map[string]string{"IDEM_PROVIDER_API_KEY": "pk_env"}); err != nil || m.ProviderAPIKey != "pk_env" {
		t.Errorf("IDEM_PROVIDER_API_KEY: %q, %v", m.ProviderAPIKey, err)
	}
	// The /metrics token: from a file or IDEM_METRICS_TOKEN.
	mt := write("metrics-token", "scrape-0123456789\n", 0o600)
	if m, _, err = parseWith(t, []string{"--metrics-token-file", mt}, nil); err != nil || m.MetricsToken != "scrape-0123456789" {
		t.Errorf("--metrics-token-file: %q, %v", m.MetricsToken, err)
	}
	if m, _, err = parseWith(t, nil, map[string]string{"IDEM_METRICS_TOKEN": "scrape-env"}); err != nil || m.MetricsToken != "scrape-env" {
		t.Errorf("IDEM_METRICS_TOKEN: %q, %v", m.MetricsToken, err)
	}
	empty := write("empty-key", "\n", 0o600)
	if _, _, err := parseWith(t, []string{"--provider-api-key-file", empty}, nil); err == nil {
		t.Error("an empty provider key file was accepted")
	}
}

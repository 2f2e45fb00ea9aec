package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProviderRequiresKeys: the simulator refuses to serve without an API
// key and an admin key of its own (from files or the environment).
func TestProviderRequiresKeys(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("k_0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--api-key-file"},
		{[]string{"--api-key-file", key}, nil, "--admin-key-file"},
		{nil, map[string]string{"IDEM_PROVIDER_API_KEY": "k1"}, "--admin-key-file"},
		{[]string{"--api-key-file", key, "--admin-key-file", key}, nil, "the same"},
		{[]string{"--api-key-file", key}, map[string]string{"IDEM_PROVIDER_API_KEY": "k1", "IDEM_PROVIDER_ADMIN_KEY": "k2"}, "set one"},
	}
	for _, tc := range cases {
		var stderr bytes.Buffer
		env := &Env{Stdout: &stderr, Stderr: &stderr, Getenv: func(k string) string { return tc.env[k] }}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // it must refuse before serving
		err := runProvider(ctx, append([]string{"--listen", "127.0.0.1:0"}, tc.args...), env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("provider %q env %v: %v, want an error about %s", tc.args, tc.env, err, tc.want)
		}
	}
}

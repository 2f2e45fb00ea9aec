package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"healthcheck", srv.URL + "/readyz"}, 0},
		{[]string{"healthcheck", srv.URL + "/other"}, 1},
		{[]string{"healthcheck", "ftp://x/readyz"}, 2},
		{[]string{"healthcheck"}, 2},
	} {
		var out, errOut bytes.Buffer
		if got := Run(t.Context(), tc.args, &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}); got != tc.want {
			t.Errorf("idemctl %q: exit %d, want %d (%s)", tc.args, got, tc.want, errOut.Bytes())
		}
	}
}

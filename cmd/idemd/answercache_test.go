package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/pgtest"
)

// TestAnswerCacheFlag: by default a node replays a settled payment from
// memory and counts it on /metrics; --answer-cache-bytes 0 turns the cache
// (and its metrics) off.
func TestAnswerCacheFlag(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		hits  string // the line /metrics shows; "" none
	}{
		{"default", nil, "idem_answer_cache_hits_total 1\n"},
		{"off", []string{"--answer-cache-bytes", "0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startIdemd(t, pgtest.NewDatabase(t), tc.flags...)
			first, body, _ := pay(t, p.url, "cached-1")
			again, replayed, h := pay(t, p.url, "cached-1")
			if first != http.StatusCreated || again != http.StatusCreated || string(replayed) != string(body) || h.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("POST, then its retry = %d, %d %s %v; want 201 replayed as the first %s", first, again, replayed, h, body)
			}
			resp, err := http.Get(p.url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			metrics := string(b)
			if tc.hits == "" && strings.Contains(metrics, "idem_answer_cache_") || tc.hits != "" && !strings.Contains(metrics, tc.hits) {
				t.Errorf("/metrics shows %q: want %q", grep(metrics, "idem_answer_cache_hits_total"), tc.hits)
			}
		})
	}
}

// grep returns the lines of s that hold word.
func grep(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package region_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
)

// TestCoordinationDotSegmentKeys: "." and ".." are not keys (idem.ValidKey),
// nor operations: a path cleaner between a caller and the node (RFC 3986
// normalisation; WHATWG URL parsers, which take %2E for a dot too) would
// resolve them, so a record begun under one could not be named again. Every
// coordination endpoint refuses them, however they are encoded, with 400
// IDEMPOTENCY_KEY_INVALID before it reads the body or the store; sent
// unencoded they never reach a handler as a key. Nothing is stored. Other
// keys made of dots, or that hold an escape, are ordinary keys.
func TestCoordinationDotSegmentKeys(t *testing.T) {
	n := newNode(t)
	hash := `{"requestHash":"v1:abc"}`
	endpoints := []struct{ method, action, body string }{
		{http.MethodPost, "begin", hash},
		{http.MethodPost, "checkpoint", `{"fencingToken":1,"checkpoint":"X"}`},
		{http.MethodPost, "complete", `{"fencingToken":1,"response":{"status":200}}`},
		{http.MethodPost, "fail", `{"fencingToken":1,"status":"FAILED_RETRYABLE"}`},
		{http.MethodGet, "", ""},
	}
	for _, key := range []string{"%2E", "%2e", "%2E%2E", ".%2E", "%2e."} {
		for _, ep := range endpoints {
			a := n.coord(ep.method, "tok-a", "op", key, ep.action, ep.body)
			expectError(t, ep.method+" key "+key+" "+ep.action, a, http.StatusBadRequest, idem.ECodeKeyInvalid)
		}
	}
	for _, op := range []string{"%2E", "%2E%2E"} {
		for _, ep := range endpoints {
			a := n.coord(ep.method, "tok-a", op, "k", ep.action, ep.body)
			expectError(t, ep.method+" operation "+op+" "+ep.action, a, http.StatusUnprocessableEntity, idem.ECodeValidationFailed)
		}
	}
	// Unencoded, net/http's mux cleans the path before any handler sees
	// it ("op/./begin" is "op/begin"): whatever answers, nothing is begun.
	for _, key := range []string{".", ".."} {
		if a := n.coord(http.MethodPost, "tok-a", "op", key, "begin", hash); a.status < 300 {
			t.Errorf("POST op/%s/begin = %d %s, want a refusal", key, a.status, a.body)
		}
	}
	if r := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); r != 0 {
		t.Errorf("%d records after dot-segment keys, want 0", r)
	}

	for path, key := range map[string]string{"...": "...", "a%2F..": "a/..", "%2E.%2E": "...", "%252E%252E": "%2E%2E", "a%2F%2E": "a/."} {
		a, d := n.begin("tok-a", "op", path, hash)
		if a.status != http.StatusOK || d.Outcome == "" || d.Record.Key != key {
			t.Errorf("begin %s = %d %s, want the key %q", path, a.status, a.body, key)
			continue
		}
		g := n.coord(http.MethodGet, "tok-a", "op", path, "", "")
		var rec struct {
			Record struct{ Key string } `json:"record"`
		}
		if err := json.Unmarshal(g.body, &rec); err != nil || g.status != http.StatusOK || rec.Record.Key != key {
			t.Errorf("GET %s = %d %s, want the record of %q", path, g.status, g.body, key)
		}
	}
}

package region_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/storetest"
)

const coordBase = "/v1/coordination/"

type beginAnswer struct {
	Outcome      string `json:"outcome"`
	FencingToken int64  `json:"fencingToken"`
	Record       struct {
		Key          string     `json:"key"`
		Status       string     `json:"status"`
		RequestHash  string     `json:"requestHash"`
		HashVersion  int        `json:"hashVersion"`
		Owner        string     `json:"owner"`
		FencingToken int64      `json:"fencingToken"`
		LockedUntil  *time.Time `json:"lockedUntil"`
		CreatedAt    time.Time  `json:"createdAt"`
		ExpiresAt    time.Time  `json:"expiresAt"`
		Checkpoint   string     `json:"checkpoint"`
		HomeRegion   string     `json:"homeRegion"`
	} `json:"record"`
	Response *struct {
		Status        int               `json:"status"`
		Headers       map[string]string `json:"headers"`
		Body          []byte            `json:"body"`
		SchemaVersion string            `json:"schemaVersion"`
	} `json:"response"`
	ExpiredRetry *bool `json:"expiredRetry"`
}

func (n *node) coord(method, token, op, key, action, body string) answer {
	n.t.Helper()
	path := coordBase + op + "/" + key
	if action != "" {
		path += "/" + action
	}
	return n.do(method, path, token, nil, body)
}

func (n *node) begin(token, op, key, body string) (answer, beginAnswer) {
	n.t.Helper()
	a := n.coord(http.MethodPost, token, op, key, "begin", body)
	var b beginAnswer
	if a.status == http.StatusOK {
		if err := json.Unmarshal(a.body, &b); err != nil {
			n.t.Fatalf("begin answer %s: %v", a.body, err)
		}
		if b.ExpiredRetry == nil {
			n.t.Errorf("begin answer without expiredRetry: %s", a.body)
		}
	}
	return a, b
}

// expectError checks status, code and that the body is exactly an RFC
// 9457 problem with errorCode and message (application/problem+json).
func expectError(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	var p map[string]any
	err := json.Unmarshal(a.body, &p)
	if err != nil || a.status != status || a.code() != code || len(p) != 6 || p["message"] == "" || p["detail"] != p["message"] ||
		p["status"] != float64(status) || p["title"] == "" || p["type"] != idemhttp.DefaultTypeBase+strings.ToLower(code) ||
		a.header.Get("Content-Type") != idemhttp.ProblemContentType {
		t.Errorf("%s = %d %s (%s), want %d, a problem with errorCode %s", what, a.status, a.body, a.header.Get("Content-Type"), status, code)
	}
}

// TestCoordinationCommandHash: with "command" the node hashes like
// fingerprint.Hash, so differently ordered objects are the same command.
func TestCoordinationCommandHash(t *testing.T) {
	n := newNode(t)
	cmdA := `{"command":{"amount":"10.00","account":{"id":"acc_1","region":"eu"},"tags":["x","y"],"n":1.0}}`
	cmdB := `{"command":{"tags":["x","y"],"n":1,"account":{"region":"eu","id":"acc_1"},"amount":"10.00"}}`
	want, err := fingerprint.Hash("charge", map[string]any{
		"amount": "10.00", "account": map[string]any{"id": "acc_1", "region": "eu"}, "tags": []any{"x", "y"}, "n": 1,
	})
	if err != nil {
		t.Fatal(err)
	}

	a, first := n.begin("tok-a", "charge", "cmd-1", cmdA)
	if a.status != http.StatusOK || first.Outcome != "execute" || first.FencingToken != 1 || first.Record.RequestHash != want ||
		first.Record.HashVersion != fingerprint.Version || first.Record.Owner != "coord/tenant-a" || first.Record.HomeRegion != "test" {
		t.Fatalf("first begin = %d %s; want execute with hash %s", a.status, a.body, want)
	}
	// Defaults: a 30 s lock and the node's replay window (1 h), on the store's clock.
	if first.Record.LockedUntil == nil || first.Record.LockedUntil.Sub(first.Record.CreatedAt) != 30*time.Second ||
		first.Record.ExpiresAt.Sub(first.Record.CreatedAt) != time.Hour {
		t.Errorf("lock/window = %v/%v, want 30s/1h", first.Record.LockedUntil, first.Record.ExpiresAt.Sub(first.Record.CreatedAt))
	}

	a, again := n.begin("tok-a", "charge", "cmd-1", cmdB)
	if a.status != http.StatusOK || again.Outcome != "in_progress" || again.FencingToken != 0 || a.header.Get("Retry-After") != "1" {
		t.Errorf("reordered command while running = %d %v %s, want in_progress with Retry-After: 1", a.status, a.header, a.body)
	}
	a, other := n.begin("tok-a", "charge", "cmd-1", strings.Replace(cmdB, `"10.00"`, `"10.01"`, 1))
	if a.status != http.StatusOK || other.Outcome != "conflict" || other.FencingToken != 0 || a.header.Get("Retry-After") != "" {
		t.Errorf("different command = %d %s, want 200 conflict", a.status, a.body)
	}

	body := []byte{0xff, 0x00, '{', '}'}
	complete := `{"fencingToken":1,"response":{"status":201,"headers":{"Location":"/charges/c1"},"body":"` +
		base64.StdEncoding.EncodeToString(body) + `","schemaVersion":"v1"},"resourceType":"charge","resourceId":"c1"}`
	if a := n.coord(http.MethodPost, "tok-a", "charge", "cmd-1", "complete", complete); a.status != http.StatusNoContent || len(a.body) != 0 {
		t.Fatalf("complete = %d %s", a.status, a.body)
	}
	// A reordered command, and the caller's own hash of it, both replay.
	for _, req := range []string{cmdB, `{"requestHash":"` + want + `"}`} {
		a, r := n.begin("tok-a", "charge", "cmd-1", req)
		if a.status != http.StatusOK || r.Outcome != "replay" || r.FencingToken != 0 || r.Response == nil ||
			r.Response.Status != 201 || !bytes.Equal(r.Response.Body, body) || r.Response.Headers["Location"] != "/charges/c1" ||
			r.Response.SchemaVersion != "v1" || r.Record.Status != "COMPLETED" {
			t.Errorf("begin %s after complete = %d %s, want replay of the stored response", req, a.status, a.body)
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_replay_total")); got != 2 {
		t.Errorf("idempotency_replay_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_conflict_different_request_total")); got != 1 {
		t.Errorf("conflict counter = %v, want 1", got)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_in_progress_answers_total")); got != 1 {
		t.Errorf("in-progress counter = %v, want 1", got)
	}
}

// TestCoordinationLifecycle: begin, checkpoint, complete, get over HTTP, and
// the answers to stale tokens and invalid writes.
func TestCoordinationLifecycle(t *testing.T) {
	n := newNode(t)
	a, d := n.begin("tok-a", "ship.order", "k-1", `{"requestHash":"v1:abc","lockTimeoutSeconds":120,"windowSeconds":600,"owner":"worker-7"}`)
	if a.status != http.StatusOK || d.Outcome != "execute" || d.Record.Owner != "worker-7" ||
		d.Record.LockedUntil.Sub(d.Record.CreatedAt) != 2*time.Minute || d.Record.ExpiresAt.Sub(d.Record.CreatedAt) != 10*time.Minute {
		t.Fatalf("begin = %d %s", a.status, a.body)
	}
	for _, tc := range []struct {
		name, action, body string
		status             int
		code               string
	}{
		{"checkpoint", "checkpoint", `{"fencingToken":1,"checkpoint":"LABEL_PRINTED"}`, 204, ""},
		{"checkpoint without token", "checkpoint", `{"checkpoint":"X"}`, 422, idem.ECodeValidationFailed},
		{"checkpoint with zero token", "checkpoint", `{"fencingToken":0,"checkpoint":"X"}`, 422, idem.ECodeValidationFailed},
		{"checkpoint with a token string", "checkpoint", `{"fencingToken":"1","checkpoint":"X"}`, 422, idem.ECodeValidationFailed},
		{"checkpoint without checkpoint", "checkpoint", `{"fencingToken":1}`, 422, idem.ECodeValidationFailed},
		{"fail with a bad status", "fail", `{"fencingToken":1,"status":"COMPLETED"}`, 422, idem.ECodeValidationFailed},
		{"fail without status", "fail", `{"fencingToken":1}`, 422, idem.ECodeValidationFailed},
		{"complete without response", "complete", `{"fencingToken":1}`, 422, idem.ECodeValidationFailed},
		{"complete with status 99", "complete", `{"fencingToken":1,"response":{"status":99}}`, 422, idem.ECodeValidationFailed},
		{"complete with a bad body", "complete", `{"fencingToken":1,"response":{"status":200,"body":"not base64!"}}`, 422, idem.ECodeValidationFailed},
		{"complete with a bad header", "complete", `{"fencingToken":1,"response":{"status":200,"headers":{"X":"a\r\nSet-Cookie: x"}}}`, 422, idem.ECodeValidationFailed},
		{"complete with an unknown nested field", "complete", `{"fencingToken":1,"response":{"status":200,"bodyText":"x"}}`, 422, idem.ECodeValidationFailed},
		{"complete", "complete", `{"fencingToken":1,"response":{"status":200,"body":"b2s="}}`, 204, ""},
		{"complete twice", "complete", `{"fencingToken":1,"response":{"status":500}}`, 409, idem.ECodeFencingTokenStale},
		{"fail after complete", "fail", `{"fencingToken":1,"status":"FAILED_RETRYABLE"}`, 409, idem.ECodeFencingTokenStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := n.coord(http.MethodPost, "tok-a", "ship.order", "k-1", tc.action, tc.body)
			if tc.status == http.StatusNoContent {
				if a.status != tc.status || len(a.body) != 0 {
					t.Errorf("%s = %d %s, want 204", tc.action, a.status, a.body)
				}
				return
			}
			expectError(t, tc.action, a, tc.status, tc.code)
		})
	}
	get := n.coord(http.MethodGet, "tok-a", "ship.order", "k-1", "", "")
	var rec struct {
		Record struct {
			Status, Checkpoint string
			FencingToken       int64
		}
		Response struct {
			Status int
			Body   []byte
		}
	}
	if err := json.Unmarshal(get.body, &rec); err != nil || get.status != 200 || rec.Record.Status != "COMPLETED" ||
		rec.Record.FencingToken != 1 || rec.Response.Status != 200 || string(rec.Response.Body) != "ok" ||
		get.header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET = %d %s", get.status, get.body)
	}
	if a := n.coord(http.MethodDelete, "tok-a", "ship.order", "k-1", "begin", ""); a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != "POST" {
		t.Errorf("DELETE begin = %d %v %s", a.status, a.header, a.body)
	}
	if a := n.coord(http.MethodPost, "tok-a", "ship.order", "k-1", "", "{}"); a.status != http.StatusMethodNotAllowed || a.code() != idem.ECodeMethodNotAllowed {
		t.Errorf("POST record = %d %s", a.status, a.body)
	}
}

// TestCoordinationRejects: malformed requests are refused with stable codes and
// write nothing.
func TestCoordinationRejects(t *testing.T) {
	n := newNode(t)
	hash := `{"requestHash":"v1:abc"}`
	big := `{"command":{"x":"` + strings.Repeat("x", 70<<10) + `"}}`
	for _, tc := range []struct {
		name, token, op, key, body string
		status                     int
		code                       string
	}{
		{"no token", "", "op", "k", hash, 401, idem.ECodeUnauthenticated},
		{"unknown token", "nope", "op", "k", hash, 401, idem.ECodeUnauthenticated},
		{"hash and command", "tok-a", "op", "k", `{"requestHash":"v1:abc","command":{"a":1}}`, 422, idem.ECodeValidationFailed},
		{"neither hash nor command", "tok-a", "op", "k", `{"owner":"me"}`, 422, idem.ECodeValidationFailed},
		{"command not an object", "tok-a", "op", "k", `{"command":[1,2]}`, 422, idem.ECodeValidationFailed},
		{"null command", "tok-a", "op", "k", `{"command":null}`, 422, idem.ECodeValidationFailed},
		{"command naming the operation", "tok-a", "op", "k", `{"command":{"operation":"other","a":1}}`, 422, idem.ECodeValidationFailed},
		{"hash without version", "tok-a", "op", "k", `{"requestHash":"abc"}`, 422, idem.ECodeValidationFailed},
		{"hash with spaces", "tok-a", "op", "k", `{"requestHash":"v1:a b"}`, 422, idem.ECodeValidationFailed},
		{"key with space", "tok-a", "op", "a%20b", hash, 400, idem.ECodeKeyInvalid},
		{"key too long", "tok-a", "op", strings.Repeat("k", 256), hash, 400, idem.ECodeKeyInvalid},
		{"key with non-ASCII", "tok-a", "op", "caf%C3%A9", hash, 400, idem.ECodeKeyInvalid},
		{"operation in upper case", "tok-a", "Op", "k", hash, 422, idem.ECodeValidationFailed},
		{"operation too long", "tok-a", strings.Repeat("o", 65), "k", hash, 422, idem.ECodeValidationFailed},
		{"operation with slash", "tok-a", "a%2Fb", "k", hash, 422, idem.ECodeValidationFailed},
		{"the node's own operation", "tok-a", "create_payment", "k", hash, 422, idem.ECodeValidationFailed},
		{"unknown field", "tok-a", "op", "k", `{"requestHash":"v1:abc","tenant":"tenant-b"}`, 422, idem.ECodeValidationFailed},
		{"malformed json", "tok-a", "op", "k", `{"requestHash":`, 422, idem.ECodeRequestMalformed},
		{"two objects", "tok-a", "op", "k", hash + hash, 422, idem.ECodeRequestMalformed},
		{"empty body", "tok-a", "op", "k", ``, 422, idem.ECodeRequestMalformed},
		{"null body", "tok-a", "op", "k", `null`, 422, idem.ECodeValidationFailed},
		{"too large", "tok-a", "op", "k", big, 413, idem.ECodeBodyTooLarge},
		{"lock 0", "tok-a", "op", "k", `{"requestHash":"v1:abc","lockTimeoutSeconds":0}`, 422, idem.ECodeValidationFailed},
		{"lock over an hour", "tok-a", "op", "k", `{"requestHash":"v1:abc","lockTimeoutSeconds":3601}`, 422, idem.ECodeValidationFailed},
		{"window over 30 days", "tok-a", "op", "k", `{"requestHash":"v1:abc","windowSeconds":2592001}`, 422, idem.ECodeValidationFailed},
		{"fractional window", "tok-a", "op", "k", `{"requestHash":"v1:abc","windowSeconds":1.5}`, 422, idem.ECodeValidationFailed},
		{"owner too long", "tok-a", "op", "k", `{"requestHash":"v1:abc","owner":"` + strings.Repeat("o", 129) + `"}`, 422, idem.ECodeValidationFailed},
		{"claim id too short", "tok-a", "op", "k", `{"requestHash":"v1:abc","claimId":"` + strings.Repeat("c", 15) + `"}`, 422, idem.ECodeValidationFailed},
		{"claim id too long", "tok-a", "op", "k", `{"requestHash":"v1:abc","claimId":"` + strings.Repeat("c", 65) + `"}`, 422, idem.ECodeValidationFailed},
		{"claim id with a space", "tok-a", "op", "k", `{"requestHash":"v1:abc","claimId":"0123456789 abcdef"}`, 422, idem.ECodeValidationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := n.coord(http.MethodPost, tc.token, tc.op, tc.key, "begin", tc.body)
			expectError(t, "begin", a, tc.status, tc.code)
		})
	}
	if a := n.do(http.MethodPost, coordBase+"op/k/begin", "tok-a", map[string]string{"Content-Type": "text/plain"}, hash); a.status != 415 {
		t.Errorf("text/plain = %d %s", a.status, a.body)
	}
	if a := n.coord(http.MethodGet, "tok-a", "op", "a%20b", "", ""); a.status != 400 || a.code() != idem.ECodeKeyInvalid {
		t.Errorf("GET bad key = %d %s", a.status, a.body)
	}
	if a := n.coord(http.MethodPost, "nope", "op", "k", "complete", `{"fencingToken":1,"response":{"status":200}}`); a.status != 401 {
		t.Errorf("complete with unknown token = %d %s", a.status, a.body)
	}
	if r := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); r != 0 {
		t.Errorf("%d records after rejected requests, want 0", r)
	}
	// The boundaries themselves are accepted.
	ok := []string{
		`{"requestHash":"v1:abc","lockTimeoutSeconds":3600,"windowSeconds":2592000,"owner":"` + strings.Repeat("ö", 128) + `"}`,
		`{"requestHash":"v1:abc","claimId":"` + strings.Repeat("c", 16) + `"}`,
		`{"requestHash":"v1:abc","claimId":"` + strings.Repeat("c", 64) + `"}`,
	}
	for i, body := range ok {
		if a, d := n.begin("tok-a", strings.Repeat("o", 64), "edge-"+string(rune('a'+i)), body); a.status != 200 || d.Outcome != "execute" {
			t.Errorf("begin %s = %d %s", body, a.status, a.body)
		}
	}
}

// TestCoordinationClaimIDAfterALostAnswer: a begin sent again with the
// claimId of one whose answer the caller never saw is handed the record
// that claim inserted, with its fencing token, while the record is open;
// a begin with another claimId (or none) finds the key in progress; once
// the record is settled, the same claimId is answered as any retry.
func TestCoordinationClaimIDAfterALostAnswer(t *testing.T) {
	n := newNode(t)
	const claim = `{"requestHash":"v1:abc","claimId":"claim-0123456789abcdef"}`
	first, d := n.begin("tok-a", "op", "k-lost", claim)
	if first.status != http.StatusOK || d.Outcome != "execute" || d.FencingToken != 1 {
		t.Fatalf("begin = %d %s", first.status, first.body)
	}
	// The caller never saw that answer and sends the begin again.
	a, d := n.begin("tok-a", "op", "k-lost", claim)
	if a.status != http.StatusOK || d.Outcome != "execute" || d.FencingToken != 1 {
		t.Errorf("begin again with its claim id = %d %s, want execute with token 1", a.status, a.body)
	}
	for _, other := range []string{`{"requestHash":"v1:abc","claimId":"claim-another-request-0"}`, `{"requestHash":"v1:abc"}`} {
		if a, d := n.begin("tok-a", "op", "k-lost", other); a.status != http.StatusOK || d.Outcome != "in_progress" || d.FencingToken != 0 {
			t.Errorf("begin %s = %d %s, want in progress", other, a.status, a.body)
		}
	}
	// Another tenant's claim id does not reach the key (tenants do not share keys).
	if a, d := n.begin("tok-b", "op", "k-lost", claim); a.status != http.StatusOK || d.Outcome != "execute" {
		t.Errorf("tenant b's begin = %d %s, want a claim of its own key", a.status, a.body)
	}
	if a := n.coord(http.MethodPost, "tok-a", "op", "k-lost", "complete", `{"fencingToken":1,"response":{"status":201,"body":"b2s="}}`); a.status != http.StatusNoContent {
		t.Fatalf("complete = %d %s", a.status, a.body)
	}
	if a, d := n.begin("tok-a", "op", "k-lost", claim); a.status != http.StatusOK || d.Outcome != "replay" || d.FencingToken != 0 ||
		d.Response == nil || string(d.Response.Body) != "ok" {
		t.Errorf("begin with its claim id after completion = %d %s, want the replay", a.status, a.body)
	}
}

// TestCoordinationTenantIsolation: another tenant's key is indistinguishable
// from an absent one, and a write with a guessed token cannot reach it (the
// record is left as it was).
func TestCoordinationTenantIsolation(t *testing.T) {
	n := newNode(t)
	if a, d := n.begin("tok-a", "op", "only-a", `{"requestHash":"v1:abc"}`); d.Outcome != "execute" {
		t.Fatalf("begin = %d %s", a.status, a.body)
	}
	theirs := n.coord(http.MethodGet, "tok-b", "op", "only-a", "", "")
	absent := n.coord(http.MethodGet, "tok-b", "op", "never-used", "", "")
	expectError(t, "GET another tenant's key", theirs, 404, idem.ECodeRecordNotFound)
	if !bytes.Equal(theirs.body, absent.body) {
		t.Errorf("another tenant's key %s differs from an absent one %s", theirs.body, absent.body)
	}
	for _, action := range []string{"checkpoint", "complete", "fail"} {
		body := `{"fencingToken":1,"checkpoint":"X"}`
		switch action {
		case "complete":
			body = `{"fencingToken":1,"response":{"status":200}}`
		case "fail":
			body = `{"fencingToken":1,"status":"FAILED_RETRYABLE"}`
		}
		expectError(t, "tenant-b "+action, n.coord(http.MethodPost, "tok-b", "op", "only-a", action, body), 409, idem.ECodeFencingTokenStale)
	}
	mine := n.coord(http.MethodGet, "tok-a", "op", "only-a", "", "")
	if mine.status != 200 || !strings.Contains(string(mine.body), `"status":"IN_PROGRESS","checkpoint":"RECEIVED"`) ||
		!strings.Contains(string(mine.body), `"fencingToken":1,`) {
		t.Errorf("own record = %d %s", mine.status, mine.body)
	}
	// The same key in tenant-b is a separate operation.
	if a, d := n.begin("tok-b", "op", "only-a", `{"requestHash":"v1:zzz"}`); d.Outcome != "execute" || d.FencingToken != 1 {
		t.Errorf("tenant-b begin = %d %s, want its own execute", a.status, a.body)
	}
}

// TestCoordinationConcurrentBegin: 20 begins at once on one key, exactly one
// executes.
func TestCoordinationConcurrentBegin(t *testing.T) {
	n := newNode(t)
	answers := concurrently(20, func() answer {
		return n.coord(http.MethodPost, "tok-a", "op", "race-1", "begin", `{"command":{"b":2,"a":1}}`)
	})
	executes := 0
	for _, a := range answers {
		var d beginAnswer
		if err := json.Unmarshal(a.body, &d); err != nil || a.status != http.StatusOK {
			t.Errorf("answer %d %s", a.status, a.body)
			continue
		}
		switch d.Outcome {
		case "execute":
			executes++
			if d.FencingToken != 1 {
				t.Errorf("execute with token %d", d.FencingToken)
			}
		case "in_progress":
			if d.FencingToken != 0 || a.header.Get("Retry-After") != "1" {
				t.Errorf("in_progress answer %v %s", a.header, a.body)
			}
		default:
			t.Errorf("outcome %s", a.body)
		}
	}
	if executes != 1 {
		t.Errorf("%d executes, want exactly 1", executes)
	}
	if r := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); r != 1 {
		t.Errorf("%d records, want 1", r)
	}
}

// TestCoordinationRecoverAndExpire: a stale or unknown record is taken over
// with a higher token; a settled record past its window becomes a new
// operation.
func TestCoordinationRecoverAndExpire(t *testing.T) {
	n := newNode(t)
	n.begin("tok-a", "op", "k", `{"requestHash":"v1:abc"}`)
	if a := n.coord(http.MethodPost, "tok-a", "op", "k", "fail", `{"fencingToken":1,"status":"UNKNOWN_REQUIRES_RECOVERY","errorCode":"TIMEOUT"}`); a.status != 204 {
		t.Fatalf("fail = %d %s", a.status, a.body)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_unknown_state_total")); got != 1 {
		t.Errorf("unknown state counter = %v, want 1", got)
	}
	a, d := n.begin("tok-a", "op", "k", `{"requestHash":"v1:abc"}`)
	if d.Outcome != "recover" || d.FencingToken != 2 || d.Record.Checkpoint != "RECEIVED" {
		t.Fatalf("begin after unknown = %d %s, want recover with token 2", a.status, a.body)
	}
	if a := n.coord(http.MethodPost, "tok-a", "op", "k", "complete", `{"fencingToken":2,"response":{"status":200}}`); a.status != 204 {
		t.Fatalf("complete = %d %s", a.status, a.body)
	}
	storetest.Exec(t, n.store, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second'`)
	a, d = n.begin("tok-a", "op", "k", `{"requestHash":"v1:other"}`)
	if d.Outcome != "expired" || d.FencingToken != 3 || d.ExpiredRetry == nil || !*d.ExpiredRetry || d.Response != nil {
		t.Errorf("begin after window = %d %s, want expired with token 3", a.status, a.body)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_expired_retry_total")); got != 1 {
		t.Errorf("expired retry counter = %v, want 1", got)
	}
}

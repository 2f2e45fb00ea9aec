package region_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/adminapi"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

const adminToken = "adm-0123456789abcdef"

// newAdminNode is a node with an admin token (principal alice) beside the
// tenants' tokens.
func newAdminNode(t *testing.T) *node {
	t.Helper()
	st, _ := storetest.New(t)
	return startNode(t, st, payments.NewService(st, payments.Config{Region: "test", Window: time.Hour}),
		region.Config{NodeID: "n1", AdminTokens: map[string]string{adminToken: "alice"}})
}

// unknownRecord makes tenant-a's record of op/key UNKNOWN_REQUIRES_RECOVERY
// through the coordination API.
func (n *node) unknownRecord(key string) {
	n.t.Helper()
	if a, d := n.begin("tok-a", "op", key, `{"requestHash":"v1:abc"}`); d.Outcome != "execute" {
		n.t.Fatalf("begin %s = %d %s", key, a.status, a.body)
	}
	if a := n.coord(http.MethodPost, "tok-a", "op", key, "fail", `{"fencingToken":1,"status":"UNKNOWN_REQUIRES_RECOVERY"}`); a.status != 204 {
		n.t.Fatalf("fail %s = %d %s", key, a.status, a.body)
	}
}

func decode[T any](t *testing.T, a answer) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("answer %d %s: %v", a.status, a.body, err)
	}
	return v
}

// TestAdminRecordsAuthentication: the admin API answers only its own
// tokens: no token, a wrong one and a tenant's token are 401
// UNAUTHENTICATED, on every admin endpoint, before anything is read or
// written; a node without admin tokens refuses every request; a token that
// is both a tenant's and an admin's is refused at start.
func TestAdminRecordsAuthentication(t *testing.T) {
	n := newAdminNode(t)
	n.unknownRecord("k1")
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/admin/records", ""},
		{http.MethodGet, "/v1/admin/records/tenant-a/op/k1", ""},
		{http.MethodPost, "/v1/admin/records/tenant-a/op/k1/settle", `{"as":"FAILED_RETRYABLE","reason":"r"}`},
	} {
		for _, token := range []string{"", "tok-a", "adm-wrong", adminToken + "x"} {
			a := n.do(req.method, req.path, token, nil, req.body)
			expectError(t, req.method+" "+req.path+" with "+token, a, http.StatusUnauthorized, idem.ECodeUnauthenticated)
			if a.header.Get("WWW-Authenticate") != `Bearer realm="idem-admin"` {
				t.Errorf("%s %s: WWW-Authenticate %q", req.method, req.path, a.header.Get("WWW-Authenticate"))
			}
		}
	}
	if a := n.do(http.MethodGet, "/v1/admin/records/tenant-a/op/k1", adminToken, nil, ""); a.status != 200 || a.header.Get("Cache-Control") != "no-store" {
		t.Errorf("with the admin token: %d %v %s", a.status, a.header, a.body)
	}
	if d := decode[adminapi.Record](t, n.do(http.MethodGet, "/v1/admin/records/tenant-a/op/k1", adminToken, nil, "")); d.Status != string(idem.StatusUnknown) {
		t.Errorf("refused settles changed the record: %+v", d)
	}
	// A tenant's token never reads the admin API, nor an admin token the
	// tenants' endpoints.
	if a := n.do(http.MethodGet, "/v1/idempotency/records/op/k1", adminToken, nil, ""); a.status != http.StatusUnauthorized {
		t.Errorf("an admin token at a tenant's endpoint: %d %s", a.status, a.body)
	}

	st, _ := storetest.New(t)
	pay := payments.NewService(st, payments.Config{Region: "test"})
	plain := startNode(t, st, pay, region.Config{})
	expectError(t, "a node without admin tokens", plain.do(http.MethodGet, "/v1/admin/records", "tok-a", nil, ""), http.StatusUnauthorized, idem.ECodeUnauthenticated)
	for _, admin := range []map[string]string{{"tok-a": "alice"}, {"": "alice"}, {"adm-x": "al ice"}} {
		if _, err := region.NewServer(region.Config{Tokens: map[string]string{"tok-a": "tenant-a"}, AdminTokens: admin}, st); err == nil {
			t.Errorf("NewServer accepted admin tokens %v", admin)
		} else if strings.Contains(err.Error(), "tok-a") {
			t.Errorf("NewServer's error quotes a token: %v", err)
		}
	}
}

// TestAdminRecordsSettle: the admin API lists, shows and settles a stuck
// record as the admin token's principal, counts it, and answers problems
// with stable codes for what it refuses.
func TestAdminRecordsSettle(t *testing.T) {
	n := newAdminNode(t)
	n.unknownRecord("k1")
	n.unknownRecord("k2")
	n.begin("tok-b", "op", "k3", `{"requestHash":"v1:abc"}`) // IN_PROGRESS under its lock
	get := func(path string) answer { return n.do(http.MethodGet, path, adminToken, nil, "") }
	settle := func(path, body string) answer { return n.do(http.MethodPost, path+"/settle", adminToken, nil, body) }

	list := decode[adminapi.RecordList](t, get("/v1/admin/records?status=UNKNOWN_REQUIRES_RECOVERY"))
	if len(list.Records) != 2 || list.Records[0].Key != "k1" || list.Records[1].Key != "k2" || !list.Records[0].Stuck || list.NextCursor != "" {
		t.Fatalf("unknown records: %+v", list)
	}
	// Paged, one a page, through every record.
	var keys []string
	for path := "/v1/admin/records?limit=1"; ; {
		page := decode[adminapi.RecordList](t, get(path))
		for _, r := range page.Records {
			keys = append(keys, r.Tenant+"/"+r.Key)
		}
		if page.NextCursor == "" {
			break
		}
		path = "/v1/admin/records?limit=1&cursor=" + url.QueryEscape(page.NextCursor)
	}
	if strings.Join(keys, " ") != "tenant-a/k1 tenant-a/k2 tenant-b/k3" {
		t.Errorf("paged through %v", keys)
	}
	if l := decode[adminapi.RecordList](t, get("/v1/admin/records?tenant=tenant-b&operation=op&olderThan=0s")); len(l.Records) != 1 || !l.Records[0].LockHeld || l.Records[0].Stuck {
		t.Errorf("tenant-b's records: %+v", l)
	}
	if l := decode[adminapi.RecordList](t, get("/v1/admin/records?olderThan=1h")); len(l.Records) != 0 || l.Records == nil {
		t.Errorf("records older than an hour: %s", get("/v1/admin/records?olderThan=1h").body)
	}

	a := settle("/v1/admin/records/tenant-a/op/k1", `{"as":"FAILED_RETRYABLE","reason":"TICKET-7: the upstream never got it"}`)
	got := decode[adminapi.Record](t, a)
	if a.status != 200 || got.Status != string(idem.StatusFailedRetryable) || got.Checkpoint != string(idem.CheckpointReceived) || got.FencingToken != 2 ||
		got.Settlement == nil || got.Settlement.By != "alice via node n1" || got.Settlement.Reason != "TICKET-7: the upstream never got it" {
		t.Fatalf("settle: %d %s", a.status, a.body)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idem_records_settled_total")); got != 1 {
		t.Errorf("idem_records_settled_total = %v, want 1", got)
	}
	// The late owner is fenced; the next begin takes the record over at
	// RECEIVED, to run it again.
	if a := n.coord(http.MethodPost, "tok-a", "op", "k1", "complete", `{"fencingToken":1,"response":{"status":200}}`); a.status != http.StatusConflict {
		t.Errorf("the late owner's complete: %d %s", a.status, a.body)
	}
	if a, d := n.begin("tok-a", "op", "k1", `{"requestHash":"v1:abc"}`); d.Outcome != "recover" || d.FencingToken != 3 || d.Record.Checkpoint != "RECEIVED" {
		t.Errorf("begin after the settle: %d %s", a.status, a.body)
	}

	body := base64.StdEncoding.EncodeToString([]byte(`{"id":"tr_9"}`))
	a = settle("/v1/admin/records/tenant-a/op/k2", `{"as":"COMPLETED","reason":"the upstream has tr_9","answer":{"status":201,"headers":{"Content-Type":"application/json"},"body":"`+body+`"}}`)
	if got := decode[adminapi.Record](t, a); a.status != 200 || got.ResponseStatus != 201 || got.ResponseBytes != 13 || got.ResponseByReference {
		t.Fatalf("settle with an answer: %d %s", a.status, a.body)
	}
	if a, d := n.begin("tok-a", "op", "k2", `{"requestHash":"v1:abc"}`); d.Outcome != "replay" || d.Response == nil || string(d.Response.Body) != `{"id":"tr_9"}` {
		t.Errorf("begin after the settle with an answer: %d %s", a.status, a.body)
	}

	for _, tc := range []struct {
		what   string
		a      answer
		status int
		code   string
	}{
		{"settled already", settle("/v1/admin/records/tenant-a/op/k2", `{"as":"FAILED_RETRYABLE","reason":"again"}`), 409, idem.ECodeRecordNotStuck},
		{"under a live lock", settle("/v1/admin/records/tenant-b/op/k3", `{"as":"FAILED_RETRYABLE","reason":"r"}`), 409, idem.ECodeRecordNotStuck},
		{"absent", settle("/v1/admin/records/tenant-a/op/nope", `{"as":"FAILED_RETRYABLE","reason":"r"}`), 404, idem.ECodeRecordNotFound},
		{"absent, shown", get("/v1/admin/records/tenant-a/op/nope"), 404, idem.ECodeRecordNotFound},
		{"no reason", settle("/v1/admin/records/tenant-b/op/k3", `{"as":"FAILED_RETRYABLE"}`), 422, idem.ECodeValidationFailed},
		{"no answer", settle("/v1/admin/records/tenant-b/op/k3", `{"as":"COMPLETED","reason":"r"}`), 422, idem.ECodeValidationFailed},
		{"an unknown member", settle("/v1/admin/records/tenant-b/op/k3", `{"as":"FAILED_RETRYABLE","reason":"r","by":"mallory"}`), 422, idem.ECodeValidationFailed},
		{"not JSON", settle("/v1/admin/records/tenant-b/op/k3", `as=FAILED_RETRYABLE`), 422, idem.ECodeRequestMalformed},
		{"a bad key", get("/v1/admin/records/tenant-a/op/%2E%2E"), 400, idem.ECodeKeyInvalid},
		{"a bad operation", get("/v1/admin/records/tenant-a/Op/k1"), 422, idem.ECodeValidationFailed},
		{"a bad status", get("/v1/admin/records?status=STUCK"), 422, idem.ECodeValidationFailed},
		{"a misspelt filter", get("/v1/admin/records?staus=IN_PROGRESS"), 422, idem.ECodeValidationFailed},
		{"a filter twice", get("/v1/admin/records?tenant=a&tenant=b"), 422, idem.ECodeValidationFailed},
		{"a bad age", get("/v1/admin/records?olderThan=ten"), 422, idem.ECodeValidationFailed},
		{"a bad limit", get("/v1/admin/records?limit=0"), 422, idem.ECodeValidationFailed},
		{"a bad cursor", get("/v1/admin/records?cursor=abc"), 422, idem.ECodeValidationFailed},
		{"a wrong method", n.do(http.MethodDelete, "/v1/admin/records/tenant-a/op/k1", adminToken, nil, ""), 405, idem.ECodeMethodNotAllowed},
		{"a GET of settle", get("/v1/admin/records/tenant-a/op/k1/settle"), 405, idem.ECodeMethodNotAllowed},
	} {
		expectError(t, tc.what, tc.a, tc.status, tc.code)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idem_records_settled_total")); got != 2 {
		t.Errorf("idem_records_settled_total = %v after the refusals, want 2", got)
	}
}

package region_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/payments"
)

// TestPathParametersNeverAnswer5xx: NUL and invalid UTF-8 in a path
// parameter used to reach PostgreSQL, which refused them, and the client got
// 500 INTERNAL. They are now refused before any SQL with a client error.
func TestPathParametersNeverAnswer5xx(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodGet, "/payments/%FF", 404, payments.ECodePaymentNotFound},
		{http.MethodGet, "/payments/%00", 404, payments.ECodePaymentNotFound},
		{http.MethodGet, "/payments/pay_%C0%80", 404, payments.ECodePaymentNotFound},
		{http.MethodGet, "/payments/pay_%E2%80%AE", 404, payments.ECodePaymentNotFound},
		{http.MethodGet, "/v1/idempotency/records/create_payment/%00", 400, idem.ECodeKeyInvalid},
		{http.MethodGet, "/v1/idempotency/records/create_payment/%FF", 400, idem.ECodeKeyInvalid},
		{http.MethodGet, "/v1/idempotency/records/%FF/k1", 422, idem.ECodeValidationFailed},
		{http.MethodGet, "/v1/idempotency/records/%00/k1", 422, idem.ECodeValidationFailed},
		{http.MethodGet, "/v1/idempotency/records/create_payment%00/k1", 422, idem.ECodeValidationFailed},
		{http.MethodGet, coordBase + "charge/%00", 400, idem.ECodeKeyInvalid},
		{http.MethodGet, coordBase + "charge/%FF", 400, idem.ECodeKeyInvalid},
		{http.MethodGet, coordBase + "%FF/k1", 422, idem.ECodeValidationFailed},
		{http.MethodGet, coordBase + "%00/k1", 422, idem.ECodeValidationFailed},
	} {
		if a := n.do(tc.method, tc.path, "tok-a", nil, ""); a.status != tc.status || a.code() != tc.code {
			t.Errorf("%s %s = %d %s, want %d %s", tc.method, tc.path, a.status, a.body, tc.status, tc.code)
		}
	}
	for _, action := range []string{"begin", "checkpoint", "complete", "fail"} {
		for _, p := range []string{"charge/%00", "charge/%FF", "%FF/k1", "%00/k1", "charge/%C3%28"} {
			if a := n.do(http.MethodPost, coordBase+p+"/"+action, "tok-a", nil, `{"fencingToken":1}`); a.status >= 500 || a.code() == "" {
				t.Errorf("POST %s/%s = %d %s, want a 4xx with a code", p, action, a.status, a.body)
			}
		}
	}
	if r, _, _ := n.counts(); r != 0 {
		t.Errorf("%d records after rejected paths, want 0", r)
	}
}

// TestLargeAmountIsNotAReplay: the minor units of 999999999999999.99 and
// 999999999999999.98 are above 2^53; they used to hash alike, and the second
// command was answered as a replay of the first.
func TestLargeAmountIsNotAReplay(t *testing.T) {
	n := newNode(t)
	first := `{"accountId":"acc_1","amount":"999999999999999.99","currency":"EUR","merchantReference":"big-1"}`
	if a := n.pay("tok-a", "big", first); a.status != http.StatusCreated {
		t.Fatalf("first = %d %s", a.status, a.body)
	}
	second := strings.Replace(first, ".99", ".98", 1)
	if a := n.pay("tok-a", "big", second); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
		t.Errorf("different amount with the same key = %d %s, want 409 %s", a.status, a.body, idem.ECodeKeyReused)
	}
	if a := n.pay("tok-a", "big", first); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %d %v %s, want a replay", a.status, a.header, a.body)
	}
}

// TestAmbiguousBodiesStoreNothing: bodies that encoding/json read one way
// (last duplicate wins, names match in any case, invalid UTF-8 repaired)
// are refused before anything is stored.
func TestAmbiguousBodiesStoreNothing(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		name, body string
		code       string
	}{
		{"name in other case", `{"accountId":"acc_b","ACCOUNTID":"acc_victim","amount":"1.00","currency":"EUR","merchantReference":"r1"}`, idem.ECodeValidationFailed},
		{"duplicate amount", `{"accountId":"acc_1","amount":"1.00","amount":"2.00","currency":"EUR","merchantReference":"r2"}`, idem.ECodeRequestMalformed},
		{"invalid utf-8", "{\"accountId\":\"acc_\xff\",\"amount\":\"1.00\",\"currency\":\"EUR\",\"merchantReference\":\"r3\"}", idem.ECodeRequestMalformed},
		{"long s currency", `{"accountId":"acc_1","amount":"1.00","currency":"u\u017fd","merchantReference":"r4"}`, idem.ECodeValidationFailed},
		{"nfd reference", `{"accountId":"acc_1","amount":"1.00","currency":"EUR","merchantReference":"cafe\u0301"}`, idem.ECodeValidationFailed},
		{"bidi override", `{"accountId":"acc_1","amount":"1.00","currency":"EUR","merchantReference":"inv\u202eoice"}`, idem.ECodeValidationFailed},
		{"trailing data", `{"accountId":"acc_1","amount":"1.00","currency":"EUR","merchantReference":"r5"}x`, idem.ECodeRequestMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := n.pay("tok-a", "amb-"+strings.ReplaceAll(tc.name, " ", "-"), tc.body)
			if a.status != http.StatusUnprocessableEntity || a.code() != tc.code {
				t.Errorf("answer = %d %s, want 422 %s", a.status, a.body, tc.code)
			}
			if strings.Contains(string(a.body), "victim") {
				t.Errorf("answer %s echoes the body", a.body)
			}
		})
	}
	if r, p, e := n.counts(); r != 0 || p != 0 || e != 0 {
		t.Errorf("records/payments/events = %d/%d/%d, want 0/0/0", r, p, e)
	}
}

// TestCoordinationBodiesAreStrict: a fencing token sent twice used to take
// the last; large integers and invalid UTF-8 in "command" collapsed into one
// hash.
func TestCoordinationBodiesAreStrict(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		name, body string
		code       string
	}{
		{"command with 2^53+1", `{"command":{"n":9007199254740993}}`, idem.ECodeValidationFailed},
		{"command with a long decimal", `{"command":{"n":0.10000000000000001}}`, idem.ECodeValidationFailed},
		{"command with invalid utf-8", "{\"command\":{\"s\":\"\xff\"}}", idem.ECodeRequestMalformed},
		{"command with a duplicate", `{"command":{"a":1,"a":2}}`, idem.ECodeRequestMalformed},
		{"command null", `{"command":null}`, idem.ECodeValidationFailed},
		{"name in other case", `{"RequestHash":"v2:abc"}`, idem.ECodeValidationFailed},
		{"owner with bidi override", `{"command":{},"owner":"w\u202e1"}`, idem.ECodeValidationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := n.begin("tok-a", "charge", "strict-"+strings.ReplaceAll(tc.name, " ", "-"), tc.body)
			if a.status != http.StatusUnprocessableEntity || a.code() != tc.code {
				t.Errorf("begin = %d %s, want 422 %s", a.status, a.body, tc.code)
			}
		})
	}
	if r, _, _ := n.counts(); r != 0 {
		t.Fatalf("%d records after rejected begins, want 0", r)
	}

	a, b := n.begin("tok-a", "charge", "twice", `{"command":{"n":1}}`)
	if a.status != http.StatusOK || b.Outcome != "execute" {
		t.Fatalf("begin = %d %s", a.status, a.body)
	}
	a = n.coord(http.MethodPost, "tok-a", "charge", "twice", "checkpoint", `{"fencingToken":99,"fencingToken":1,"checkpoint":"X"}`)
	if a.status != http.StatusUnprocessableEntity || a.code() != idem.ECodeRequestMalformed {
		t.Errorf("checkpoint with fencingToken twice = %d %s, want 422 %s", a.status, a.body, idem.ECodeRequestMalformed)
	}
}

// TestCoordinationV1RecordsStillCompare: a record begun under hash version 1
// (before version 2 existed) is still the same command for a begin that
// sends the command, and still a different one for a different command.
func TestCoordinationV1RecordsStillCompare(t *testing.T) {
	n := newNode(t)
	cmd := map[string]any{"amount": "10.00", "n": 1}
	v1, err := fingerprint.HashVersion(1, "charge", cmd)
	if err != nil {
		t.Fatal(err)
	}
	a, b := n.begin("tok-a", "charge", "old", `{"requestHash":"`+v1+`"}`)
	if a.status != http.StatusOK || b.Outcome != "execute" || b.Record.HashVersion != 1 {
		t.Fatalf("v1 begin = %d %s", a.status, a.body)
	}
	if a, b := n.begin("tok-a", "charge", "old", `{"command":{"n":1.0,"amount":"10.00"}}`); a.status != http.StatusOK || b.Outcome != "in_progress" {
		t.Errorf("same command against a v1 record = %d %s, want in_progress", a.status, a.body)
	}
	if a, b := n.begin("tok-a", "charge", "old", `{"command":{"n":2,"amount":"10.00"}}`); a.status != http.StatusOK || b.Outcome != "conflict" {
		t.Errorf("different command against a v1 record = %d %s, want conflict", a.status, a.body)
	}
}

// TestCoordinationV2HashMeetsV1Record: a caller that hashes for itself sends
// only the current version's hash. Where v1 was exact it hashed the same
// bytes, so "v2:X" is the command that wrote a record as "v1:X": a retry
// across the version change replays instead of conflicting.
func TestCoordinationV2HashMeetsV1Record(t *testing.T) {
	n := newNode(t)
	cmd := map[string]any{"amount": "10.00", "n": 1}
	v1, err := fingerprint.HashVersion(1, "charge", cmd)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := fingerprint.Hash("charge", cmd)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := n.begin("tok-a", "charge", "own-hash", `{"requestHash":"`+v1+`"}`); a.status != http.StatusOK || b.Outcome != "execute" {
		t.Fatalf("v1 begin = %d %s", a.status, a.body)
	}
	if a, b := n.begin("tok-a", "charge", "own-hash", `{"requestHash":"`+v2+`"}`); a.status != http.StatusOK || b.Outcome != "in_progress" {
		t.Errorf("v2 hash of the same command = %d %s, want in_progress", a.status, a.body)
	}
	other, _ := fingerprint.Hash("charge", map[string]any{"amount": "10.01", "n": 1})
	if a, b := n.begin("tok-a", "charge", "own-hash", `{"requestHash":"`+other+`"}`); a.status != http.StatusOK || b.Outcome != "conflict" {
		t.Errorf("v2 hash of another command = %d %s, want conflict", a.status, a.body)
	}
}

package sidecar_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/sidecar"
)

// TestRawHashCoversTheFingerprint: two requests of a route with equal raw
// hashes have equal fingerprints. Over requests that differ in each input
// the fingerprint reads (method, path, query, Content-Type, semantic
// headers, body) and in what it leaves out (an ignored field, spacing,
// member order), under three routes that differ only in their Ignore and
// KeyField, each request has its own raw hash.
func TestRawHashCoversTheFingerprint(t *testing.T) {
	routes := []sidecar.Route{
		{Method: "POST", Prefix: "/transfers", Operation: "create_transfer", SemanticHeaders: []string{"X-Mode"}, Ignore: []string{"/meta/sent_at"}},
		{Method: "POST", Prefix: "/transfers", Operation: "create_transfer", SemanticHeaders: []string{"X-Mode"}},
		{Method: "POST", Prefix: "/transfers", Operation: "create_transfer", SemanticHeaders: []string{"X-Mode"}, Ignore: []string{"/meta/sent_at"}, KeyField: "/key"},
	}
	const body = `{"amount":"10.00","meta":{"sent_at":"1"}}`
	type variant struct {
		name, method, target, body string
		headers                    []string
	}
	base := variant{"base", "POST", "/transfers/acc_1?a=1&b=2", body, []string{"Content-Type", "application/json", "Api-Version", "2026-05-01"}}
	with := func(name string, change func(v *variant)) variant {
		v := base
		v.name, v.headers = name, append([]string(nil), base.headers...)
		change(&v)
		return v
	}
	set := func(name, value string) func(v *variant) {
		return func(v *variant) {
			for i := 0; i < len(v.headers); i += 2 {
				if v.headers[i] == name {
					v.headers = append(v.headers[:i:i], v.headers[i+2:]...)
					break
				}
			}
			if value != "-" {
				v.headers = append(v.headers, name, value)
			}
		}
	}
	variants := []variant{
		base,
		with("method", func(v *variant) { v.method = "PUT" }),
		with("path", func(v *variant) { v.target = "/transfers/acc_2?a=1&b=2" }),
		with("query", func(v *variant) { v.target = "/transfers/acc_1?a=2&b=2" }),
		with("query order", func(v *variant) { v.target = "/transfers/acc_1?b=2&a=1" }),
		with("no query", func(v *variant) { v.target = "/transfers/acc_1" }),
		with("form", func(v *variant) { set("Content-Type", "application/x-www-form-urlencoded")(v); v.body = "amount=10.00" }),
		with("opaque", func(v *variant) { set("Content-Type", "text/plain")(v) }),
		with("opaque charset", func(v *variant) { set("Content-Type", "text/plain; charset=utf-8")(v) }),
		with("no content type", set("Content-Type", "-")),
		with("api version", set("Api-Version", "2030-01-01")),
		with("no api version", set("Api-Version", "-")),
		with("mode", set("X-Mode", "fast")),
		with("empty mode", set("X-Mode", "")),
		with("amount", func(v *variant) { v.body = `{"amount":"10.01","meta":{"sent_at":"1"}}` }),
		with("ignored field", func(v *variant) { v.body = `{"amount":"10.00","meta":{"sent_at":"2"}}` }),
		with("spacing", func(v *variant) { v.body = `{"amount": "10.00", "meta": {"sent_at": "1"}}` }),
		with("member order", func(v *variant) { v.body = `{"meta":{"sent_at":"1"},"amount":"10.00"}` }),
		with("key field", func(v *variant) { v.body = `{"amount":"10.00","meta":{"sent_at":"1"},"key":"k1"}` }),
	}
	type hashed struct{ name, raw, hash string }
	var all []hashed
	for i, rt := range routes {
		raw, fp := sidecar.RawHashOf(rt), sidecar.FingerprintOf(rt)
		for _, v := range variants {
			r := httptest.NewRequest(v.method, v.target, strings.NewReader(v.body))
			for j := 0; j < len(v.headers); j += 2 {
				r.Header.Add(v.headers[j], v.headers[j+1])
			}
			fields, err := fp(r, []byte(v.body))
			if err != nil {
				t.Fatalf("route %d, %s: %v", i, v.name, err)
			}
			h, err := fingerprint.Hash(rt.Operation, fields)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, hashed{fmt.Sprintf("route %d, %s", i, v.name), raw(r, []byte(v.body)), h})
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.raw == b.raw {
				t.Errorf("%s and %s have one raw hash", a.name, b.name)
			}
		}
	}
	// Every request above has its own raw hash, so no two share one
	// without sharing a fingerprint. Some share a fingerprint (the
	// variants the fingerprint leaves out), or the test would not show
	// that the raw hash tells apart more than the fingerprint does.
	equated := 0
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.hash == b.hash {
				equated++
			}
		}
	}
	if equated == 0 {
		t.Errorf("no two variants have one fingerprint: the test equates nothing")
	}
}

// TestByteEqualRetryThroughTheSidecar: behind a sidecar whose engine keeps
// settled answers, a byte-equal retry, a re-serialised one and one that
// differs only in an ignored field replay the first answer, and another
// command is refused, with one upstream call.
func TestByteEqualRetryThroughTheSidecar(t *testing.T) {
	up := newUpstream(t)
	f := newFixtureWith(t, up, up.url, ";ignore=/meta/sent_at", engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}})
	const body = `{"amount":"10.00","meta":{"sent_at":"1"}}`
	first := f.post(t, "tok-a", "k1", "/transfers/acc_1", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first = %+v", first)
	}
	if rec := f.record(t, "tenant-a", "k1"); !strings.HasPrefix(rec.RawHash, fingerprint.RawPrefix) {
		t.Errorf("the record's raw hash is %q", rec.RawHash)
	}
	for _, retry := range []string{body, body, `{"meta":{"sent_at":"1"},"amount":"10.00"}`, `{"amount":"10.00","meta":{"sent_at":"2"}}`} {
		a := f.post(t, "tok-a", "k1", "/transfers/acc_1", retry)
		if a.status != first.status || a.body != first.body || a.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %s = %+v, want the first answer %+v", retry, a, first)
		}
	}
	for _, other := range [][2]string{{"/transfers/acc_1", `{"amount":"10.01","meta":{"sent_at":"1"}}`}, {"/transfers/acc_2", body}} {
		if a := f.post(t, "tok-a", "k1", other[0], other[1]); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
			t.Errorf("another command %s %s = %+v, want 409 %s", other[0], other[1], a, idem.ECodeKeyReused)
		}
	}
	if n := up.total(); n != 1 {
		t.Errorf("upstream executions = %d, want 1", n)
	}
}

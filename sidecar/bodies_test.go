package sidecar_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/sidecar"
)

// send posts body with its Content-Type (none when ct is "") and the
// given headers (name, value pairs) with client.
func (f *fixture) send(t *testing.T, client *http.Client, token, key, path, ct, body string, headers ...string) (answer, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

func (f *fixture) mustSend(t *testing.T, key, ct, body string, headers ...string) answer {
	t.Helper()
	a, err := f.send(t, http.DefaultClient, "tok-a", key, "/transfers", ct, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

const form = "application/x-www-form-urlencoded"

// TestFormBodies: a form body is fingerprinted canonically: the same
// fields in another order (and other percent-encodings of the same text)
// replay; another value, a repeated name's values in another order or an
// added field is another command; the upstream receives the bytes as sent.
func TestFormBodies(t *testing.T) {
	f := newFixture(t, "")
	sent := "amount=2000&currency=eur&metadata%5Border%5D=6735&expand%5B%5D=a&expand%5B%5D=b&description=two+words"
	first := f.mustSend(t, "kf", form, sent)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %+v", first)
	}
	if f.up.bodies[0] != sent || f.up.lastHeader().Get("Content-Type") != form {
		t.Errorf("upstream got %q (%s)", f.up.bodies[0], f.up.lastHeader().Get("Content-Type"))
	}
	for _, same := range []string{
		"description=two%20words&expand%5B%5D=a&currency=eur&amount=2000&expand%5B%5D=b&metadata[order]=6735",
		"metadata%5Border%5D=6735&&amount=2000&expand%5B%5D=a&currency=eur&description=two+words&expand%5B%5D=b",
	} {
		a := f.mustSend(t, "kf", form+"; charset=utf-8", same)
		if a.status != first.status || a.body != first.body || a.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: %+v, want a replay of %+v", same, a, first)
		}
	}
	for _, other := range []string{
		"amount=2001&currency=eur&metadata%5Border%5D=6735&expand%5B%5D=a&expand%5B%5D=b&description=two+words",
		"amount=2000&currency=eur&metadata%5Border%5D=6735&expand%5B%5D=b&expand%5B%5D=a&description=two+words",
		"amount=2000&currency=eur&metadata%5Border%5D=6735&expand%5B%5D=a&expand%5B%5D=b&description=two+words&x=",
		"amount=2000&currency=eur&metadata%5Border%5D=6735&expand%5B%5D=a&expand%5B%5D=b&description=two++words",
	} {
		if a := f.mustSend(t, "kf", form, other); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
			t.Errorf("%s: %+v, want 409 %s", other, a, idem.ECodeKeyReused)
		}
	}
	// The same fields as JSON are another command.
	if a := f.mustSend(t, "kf", "application/json", `{"amount":"2000"}`); a.status != http.StatusConflict {
		t.Errorf("JSON under a form's key: %+v", a)
	}
	if a := f.mustSend(t, "kbad", form, "amount=%zz"); a.status != http.StatusUnprocessableEntity && a.status != http.StatusBadRequest {
		t.Errorf("malformed form: %+v, want a 4xx", a)
	}
	if n := f.up.total(); n != 1 {
		t.Errorf("upstream executions = %d, want 1", n)
	}
}

// TestOpaqueBodies: any other media type is hashed as bytes with its
// Content-Type: the same bytes and type replay, another byte or another
// type is another command.
func TestOpaqueBodies(t *testing.T) {
	f := newFixture(t, "")
	xml := `<transfer><amount>10.00</amount></transfer>`
	first := f.mustSend(t, "kx", "application/xml", xml)
	if first.status != http.StatusCreated || f.up.bodies[0] != xml {
		t.Fatalf("first: %+v, upstream got %q", first, f.up.bodies)
	}
	if a := f.mustSend(t, "kx", "Application/XML", xml); a.header.Get("Idempotent-Replayed") != "true" || a.body != first.body {
		t.Errorf("same bytes: %+v", a)
	}
	for _, c := range []struct{ ct, body string }{
		{"application/xml", `<transfer><amount>10.00</amount></transfer> `},
		{"text/xml", xml},
		{"application/xml; charset=latin1", xml},
	} {
		if a := f.mustSend(t, "kx", c.ct, c.body); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
			t.Errorf("%s %q: %+v, want 409", c.ct, c.body, a)
		}
	}
	bin := "\x00\x01\xff\xfe"
	if a := f.mustSend(t, "kb", "application/octet-stream", bin); a.status != http.StatusCreated {
		t.Errorf("binary: %+v", a)
	}
	if a := f.mustSend(t, "kb", "application/octet-stream", bin); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("binary replay: %+v", a)
	}
	if a := f.mustSend(t, "kct", "no/such type", xml); a.status != http.StatusUnsupportedMediaType {
		t.Errorf("malformed Content-Type: %+v", a)
	}
	if n := f.up.total(); n != 2 {
		t.Errorf("upstream executions = %d, want 2", n)
	}
}

// TestIgnoredFields: fields named by ignore= (JSON pointers, form names)
// may change between retries; any other change is still a conflict.
func TestIgnoredFields(t *testing.T) {
	f := newFixture(t, ";ignore=/meta/sent_at;ignore=/items/0;ignore=request_time")
	first := f.mustSend(t, "kj", "application/json", `{"amount":"1.00","meta":{"sent_at":"t1","id":"m"},"items":["a","b"]}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %+v", first)
	}
	if a := f.mustSend(t, "kj", "application/json", `{"amount":"1.00","meta":{"sent_at":"t2","id":"m"},"items":["z","b"]}`); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("ignored fields changed: %+v", a)
	}
	for _, other := range []string{
		`{"amount":"1.00","meta":{"sent_at":"t2","id":"n"},"items":["a","b"]}`,
		`{"amount":"1.00","meta":{"sent_at":"t1","id":"m"},"items":["a","c"]}`,
	} {
		if a := f.mustSend(t, "kj", "application/json", other); a.status != http.StatusConflict {
			t.Errorf("%s: %+v, want 409", other, a)
		}
	}
	if a := f.mustSend(t, "kform", form, "amount=1&request_time=100"); a.status != http.StatusCreated {
		t.Fatalf("form: %+v", a)
	}
	if a := f.mustSend(t, "kform", form, "request_time=200&amount=1"); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("form, ignored field changed: %+v", a)
	}
	if a := f.mustSend(t, "kform", form, "request_time=100&amount=2"); a.status != http.StatusConflict {
		t.Errorf("form, amount changed: %+v", a)
	}
	if n := f.up.total(); n != 2 {
		t.Errorf("upstream executions = %d, want 2", n)
	}
}

// TestKeyFromBodyField: with key-field, the key is a body field (JSON or
// form), the header is not used, the field is not part of the fingerprint
// and a body without it is refused before the upstream.
func TestKeyFromBodyField(t *testing.T) {
	f := newFixture(t, ";key-field=/idempotency_key")
	first := f.mustSend(t, "", "application/json", `{"idempotency_key":"sq-1","amount":"5.00"}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %+v", first)
	}
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "sq-1", 0)
	if got := f.up.lastHeader().Get("Idempotency-Key"); got != derived {
		t.Errorf("upstream key %q, want %q (the body's key)", got, derived)
	}
	// A header naming another key changes nothing: the body's key is it.
	if a := f.mustSend(t, "other", "application/json", `{"amount":"5.00","idempotency_key":"sq-1"}`); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay by body key: %+v", a)
	}
	if a := f.mustSend(t, "", "application/json", `{"idempotency_key":"sq-1","amount":"6.00"}`); a.status != http.StatusConflict {
		t.Errorf("changed amount: %+v", a)
	}
	if a := f.mustSend(t, "", "application/json", `{"idempotency_key":"sq-2","amount":"5.00"}`); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("another key: %+v", a)
	}
	if a := f.mustSend(t, "", form, "amount=5&idempotency_key=sq-f"); a.status != http.StatusCreated {
		t.Errorf("form key: %+v", a)
	}
	if a := f.mustSend(t, "", form, "idempotency_key=sq-f&amount=5"); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("form key replay: %+v", a)
	}
	for _, c := range []struct {
		ct, body, code string
	}{
		{"application/json", `{"amount":"5.00"}`, idem.ECodeKeyMissing},
		{"application/json", `{"idempotency_key":7}`, idem.ECodeKeyInvalid},
		{"application/json", `{"idempotency_key":""}`, idem.ECodeKeyInvalid},
		{form, "amount=5", idem.ECodeKeyMissing},
	} {
		if a := f.mustSend(t, "hdr", c.ct, c.body); a.status != http.StatusBadRequest || a.code() != c.code {
			t.Errorf("%s: %+v, want 400 %s", c.body, a, c.code)
		}
	}
	if n := f.up.total(); n != 3 {
		t.Errorf("upstream executions = %d, want 3", n)
	}
}

// TestStructuredKeyHeader: the IETF draft's sf-string form of the header is
// the same key as its bare form; a malformed string is a 400.
func TestStructuredKeyHeader(t *testing.T) {
	f := newFixture(t, "")
	if a := f.mustSend(t, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "application/json", transfer); a.status != http.StatusCreated {
		t.Fatalf("first: %+v", a)
	}
	if got, want := f.up.lastHeader().Get("Idempotency-Key"), sidecar.DerivedKey("tenant-a", "create_transfer", "8e03978e-40d5-43e8-bc93-6894a57f9324", 0); got != want {
		t.Errorf("derived key %q, want the bare key's %q", got, want)
	}
	if a := f.mustSend(t, "8e03978e-40d5-43e8-bc93-6894a57f9324", "application/json", transfer); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("bare form: %+v", a)
	}
	for _, bad := range []string{`"unterminated`, `"a"b`, `"bad\escape"`, `""`, `"a";p=1`} {
		if a := f.mustSend(t, bad, "application/json", transfer); a.status != http.StatusBadRequest || a.code() != idem.ECodeKeyInvalid {
			t.Errorf("%s: %+v, want 400 %s", bad, a, idem.ECodeKeyInvalid)
		}
	}
	if n := f.up.total(); n != 1 {
		t.Errorf("upstream executions = %d, want 1", n)
	}
}

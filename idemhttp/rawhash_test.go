package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/storetest"
)

// countedFingerprint is the default Fingerprint, counting its calls.
func countedFingerprint(n *atomic.Int32) idemhttp.FingerprintFunc {
	fp := idemhttp.DefaultFingerprint()
	return func(r *http.Request, body []byte) (map[string]any, error) {
		n.Add(1)
		return fp(r, body)
	}
}

// TestByteEqualRetryIsNotFingerprinted: behind a node that keeps settled
// answers in memory, a retry with the first request's bytes (and method,
// path and semantic headers) is replayed without the Fingerprint being
// called; a re-serialised retry is fingerprinted and replayed; another
// command, or the same bytes under another Api-Version, is fingerprinted
// and refused; a body that does not parse is refused as malformed, and
// counted as rejected.
func TestByteEqualRetryIsNotFingerprinted(t *testing.T) {
	var calls, fps atomic.Int32
	f := newFixture(t, created(&calls), engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}},
		idemhttp.Options{Fingerprint: countedFingerprint(&fps), RawHash: idemhttp.DefaultRawHash(opName)})
	const body = `{"amount": "10.50", "to": "acc_2"}`
	first := f.post(t, "tok-a", "k1", body)
	if first.status != 201 || fps.Load() != 1 {
		t.Fatalf("first = %+v after %d fingerprints", first, fps.Load())
	}
	if rec := f.record(t, "tenant-a", "k1"); rec.RawHash == "" {
		t.Errorf("the record keeps no raw hash")
	}
	for i := range 3 {
		a := f.post(t, "tok-a", "k1", body)
		if a.status != 201 || a.body != first.body || a.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("byte-equal retry %d = %+v, want the first answer %+v", i, a, first)
		}
	}
	if got := fps.Load(); got != 1 {
		t.Errorf("byte-equal retries were fingerprinted (%d fingerprints, want 1)", got)
	}
	if a := f.post(t, "tok-a", "k1", `{"to":"acc_2","amount":"10.50"}`); a.status != 201 || a.body != first.body {
		t.Errorf("re-serialised retry = %+v, want the first answer", a)
	}
	if got := fps.Load(); got != 2 {
		t.Errorf("%d fingerprints after a re-serialised retry, want 2", got)
	}
	if a := f.post(t, "tok-a", "k1", `{"amount": "10.51", "to": "acc_2"}`); a.status != 409 || errorCode(t, a) != idem.ECodeKeyReused {
		t.Errorf("another command = %+v, want 409 %s", a, idem.ECodeKeyReused)
	}
	if a := f.post(t, "tok-a", "k1", body, "Api-Version", "2030-01-01"); a.status != 409 || errorCode(t, a) != idem.ECodeKeyReused {
		t.Errorf("the same bytes under another Api-Version = %+v, want 409 %s", a, idem.ECodeKeyReused)
	}
	if a := f.post(t, "tok-a", "k1", `{"amount": "10.50",`); a.status != 422 || errorCode(t, a) != idem.ECodeRequestMalformed {
		t.Errorf("a body that does not parse = %+v, want 422 %s", a, idem.ECodeRequestMalformed)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "rejected")); got != 1 {
		t.Errorf("rejected counter = %v, want 1", got)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "replay")); got != 4 {
		t.Errorf("replay counter = %v, want 4", got)
	}
	if calls.Load() != 1 {
		t.Errorf("handler calls = %d, want 1", calls.Load())
	}
	if got := storetest.Count(t, f.st, `SELECT count(*) FROM idempotency_records`); got != 1 {
		t.Errorf("records = %d, want 1", got)
	}
}

// TestFingerprintWithoutRawHash: a Fingerprint of the caller's own,
// without a RawHash to say what it reads, is called for every request,
// byte-equal retries included.
func TestFingerprintWithoutRawHash(t *testing.T) {
	var calls, fps atomic.Int32
	f := newFixture(t, created(&calls), engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}},
		idemhttp.Options{Fingerprint: countedFingerprint(&fps)})
	for range 3 {
		if a := f.post(t, "tok-a", "k1", `{"amount":"1"}`); a.status != 201 {
			t.Fatalf("answer = %+v", a)
		}
	}
	if got := fps.Load(); got != 3 {
		t.Errorf("%d fingerprints for 3 requests, want 3", got)
	}
}

// TestDefaultRawHashReadsWhatTheFingerprintReads: every input the default
// Fingerprint reads changes the default raw hash (so equal raw hashes are
// equal commands), and what it does not read (another header, the query)
// does not.
func TestDefaultRawHashReadsWhatTheFingerprintReads(t *testing.T) {
	raw := idemhttp.DefaultRawHash(opName, "Api-Version", "X-Mode")
	req := func(change func(r *http.Request) string) (*http.Request, []byte) {
		body := `{"amount":"1"}`
		r := httptest.NewRequest(http.MethodPost, "/accounts/acc_1/transfers?x=1", strings.NewReader(""))
		r.Pattern = "POST /accounts/{account}/transfers"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Api-Version", "2026-05-01")
		if change != nil {
			if b := change(r); b != "" {
				body = b
			}
		}
		return r, []byte(body)
	}
	base := raw(req(nil))
	if !strings.HasPrefix(base, "r1:") || len(base) != 67 {
		t.Fatalf("raw hash %q, want r1: and 64 hex digits", base)
	}
	differs := map[string]func(r *http.Request) string{
		"method":          func(r *http.Request) string { r.Method = http.MethodPut; return "" },
		"route":           func(r *http.Request) string { r.Pattern = "POST /accounts/{id}/transfers"; return "" },
		"path value":      func(r *http.Request) string { r.URL.Path = "/accounts/acc_2/transfers"; return "" },
		"content type":    func(r *http.Request) string { r.Header.Set("Content-Type", "text/plain"); return "" },
		"no content type": func(r *http.Request) string { r.Header.Del("Content-Type"); return "" },
		"api version":     func(r *http.Request) string { r.Header.Set("Api-Version", "2030-01-01"); return "" },
		"empty header":    func(r *http.Request) string { r.Header.Set("X-Mode", ""); return "" },
		"second value":    func(r *http.Request) string { r.Header.Add("Api-Version", "x"); return "" },
		"body":            func(r *http.Request) string { return `{"amount":"2"}` },
		"spacing":         func(r *http.Request) string { return `{"amount": "1"}` },
	}
	for name, change := range differs {
		if raw(req(change)) == base {
			t.Errorf("%s: the raw hash did not change", name)
		}
	}
	same := map[string]func(r *http.Request) string{
		"query":          func(r *http.Request) string { r.URL.RawQuery = "x=2"; return "" },
		"another header": func(r *http.Request) string { r.Header.Set("X-Request-Id", "abc"); return "" },
		"authorization":  func(r *http.Request) string { r.Header.Set("Authorization", "Bearer x"); return "" },
	}
	for name, change := range same {
		if raw(req(change)) != base {
			t.Errorf("%s, which the fingerprint does not read, changed the raw hash", name)
		}
	}
}

package sidecar_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/sidecar"
)

func TestParseRoutesErrorEnvelope(t *testing.T) {
	for _, tc := range []struct {
		opts string
		ok   bool
	}{
		{";error-envelope=stripe", true},
		{";error-envelope=problem", true},
		{";error-envelope-file=/etc/idem/envelope.json", true},
		{";error-envelope=xml", false},
		{";error-envelope", false},
		{";error-envelope=stripe;error-envelope=stripe", false},
		{";error-envelope=stripe;error-envelope-file=/x.json", false},
		{";error-envelope-file=", false},
	} {
		routes, err := sidecar.ParseRoutes("POST /charges=create_charge@http://127.0.0.1:1" + tc.opts)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok %v", tc.opts, err, tc.ok)
			continue
		}
		if err != nil {
			continue
		}
		again, err := sidecar.ParseRoutes(routes[0].String())
		if err != nil || again[0].ErrorEnvelope != routes[0].ErrorEnvelope || again[0].ErrorEnvelopeFile != routes[0].ErrorEnvelopeFile {
			t.Errorf("%q: String %q parses as %+v (%v), want the same envelope", tc.opts, routes[0].String(), again, err)
		}
	}
}

// stripeError is the error object stripe-go parses into *stripe.Error.
type stripeError struct {
	Error *struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		DocURL  string `json:"doc_url"`
	} `json:"error"`
}

func decodeStripe(t *testing.T, a answer) stripeError {
	t.Helper()
	var e stripeError
	if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Error == nil {
		t.Fatalf("%d %s: want a Stripe error object (%v)", a.status, a.body, err)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if link := a.header.Get("Link"); link != "<"+e.Error.DocURL+`>; rel="type"` || !strings.HasPrefix(e.Error.DocURL, idemhttp.DefaultTypeBase) {
		t.Errorf("Link %q, doc_url %q: want the problem type URI in both", link, e.Error.DocURL)
	}
	return e
}

// TestStripeEnvelope drives a route with error-envelope=stripe through a
// reused key, a key in progress, an unknown outcome and a missing key:
// each answers the status, Retry-After and errorCode the problem+json
// answer has, in Stripe's error object.
func TestStripeEnvelope(t *testing.T) {
	f := newFixture(t, ";error-envelope=stripe;unknown-status=503;timeout=5s")
	const body = `{"amount":100}`

	if a := f.post(t, "tok-a", "k1", "/transfers", body); a.status != http.StatusCreated && a.status != http.StatusOK {
		t.Fatalf("first request: %d %s", a.status, a.body)
	}
	a := f.post(t, "tok-a", "k1", "/transfers", `{"amount":200}`)
	e := decodeStripe(t, a)
	if a.status != http.StatusConflict || e.Error.Type != "idempotency_error" || e.Error.Code != idem.ECodeKeyReused || e.Error.Message == "" {
		t.Errorf("reused key: %d %s, want 409 idempotency_error %s", a.status, a.body, idem.ECodeKeyReused)
	}
	if a.code() != "" {
		t.Errorf("reused key: errorCode member %q in a Stripe envelope", a.code())
	}

	// A key in progress: the upstream holds the first call.
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "k2", 0)
	f.up.mu.Lock()
	f.up.delay[derived] = 1500 * time.Millisecond
	f.up.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.post(t, "tok-a", "k2", "/transfers", body)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := f.st.Get(t.Context(), idem.Scope{Tenant: "tenant-a", Operation: "create_transfer", Key: "k2"})
		if err == nil && rec.Status == idem.StatusInProgress {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record in progress for k2: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a = f.post(t, "tok-a", "k2", "/transfers", body)
	e = decodeStripe(t, a)
	if a.status != http.StatusConflict || a.header.Get("Retry-After") != "1" || e.Error.Type != "idempotency_error" || e.Error.Code != idem.ECodeInProgress {
		t.Errorf("in progress: %d Retry-After %q %s, want 409 with Retry-After 1 and %s", a.status, a.header.Get("Retry-After"), a.body, idem.ECodeInProgress)
	}
	wg.Wait()

	// An unknown outcome: the upstream drops the connection after executing.
	derived = sidecar.DerivedKey("tenant-a", "create_transfer", "k3", 0)
	f.up.mu.Lock()
	f.up.hangUp[derived] = true
	f.up.mu.Unlock()
	for i := range 2 {
		a = f.post(t, "tok-a", "k3", "/transfers", body)
		e = decodeStripe(t, a)
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" || e.Error.Type != "api_error" || e.Error.Code != idem.ECodeOutcomeUnknown {
			t.Errorf("unknown outcome, call %d: %d Retry-After %q %s, want 503 with Retry-After 1 and %s", i+1, a.status, a.header.Get("Retry-After"), a.body, idem.ECodeOutcomeUnknown)
		}
	}

	// Errors before any record: a key missing, a path outside the route.
	a = f.post(t, "tok-a", "", "/transfers", body)
	if e = decodeStripe(t, a); a.status != http.StatusBadRequest || e.Error.Type != "idempotency_error" || e.Error.Code != idem.ECodeKeyMissing {
		t.Errorf("no key: %d %s, want 400 idempotency_error %s", a.status, a.body, idem.ECodeKeyMissing)
	}
	a = f.post(t, "tok-a", "k4", "/transfers/%2e%2e/admin", body)
	if e = decodeStripe(t, a); a.status != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Code != idem.ECodePathInvalid {
		t.Errorf("path outside the route: %d %s, want 400 invalid_request_error %s", a.status, a.body, idem.ECodePathInvalid)
	}
	// The upstream's own answers pass as they are.
	if a = f.post(t, "tok-a", "k1", "/transfers", body); a.header.Get("Link") != "" || a.status >= 400 {
		t.Errorf("replay: %d %v %s, want the upstream's answer untouched", a.status, a.header, a.body)
	}
}

func TestEnvelopeTemplate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "envelope.json")
	tmpl := `{"errors":[{"code":"{{code}}","status":"{{status}}","http":"HTTP {{status}}","title":"{{title}}","detail":"{{detail}}","more":"{{type}}","{{code}}":1}],"ok":false,"n":1.5}`
	if err := os.WriteFile(path, []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, ";error-envelope-file="+path)
	f.post(t, "tok-a", "t1", "/transfers", `{"amount":1}`)
	a := f.post(t, "tok-a", "t1", "/transfers", `{"amount":2}`)
	var got struct {
		Errors []map[string]any `json:"errors"`
		OK     *bool            `json:"ok"`
		N      float64          `json:"n"`
	}
	if err := json.Unmarshal([]byte(a.body), &got); err != nil || len(got.Errors) != 1 {
		t.Fatalf("%d %s: %v", a.status, a.body, err)
	}
	m := got.Errors[0]
	want := map[string]any{"code": idem.ECodeKeyReused, "status": float64(409), "http": "HTTP 409",
		"title": "Idempotency key reused with a different request", "more": idemhttp.DefaultTypeBase + strings.ToLower(idem.ECodeKeyReused), "{{code}}": float64(1)}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("member %q: %v, want %v (body %s)", k, m[k], v, a.body)
		}
	}
	if d, _ := m["detail"].(string); d == "" || a.status != http.StatusConflict || got.OK == nil || *got.OK || got.N != 1.5 {
		t.Errorf("%d %s: want 409, a detail and the template's other members", a.status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" || a.header.Get("Link") == "" {
		t.Errorf("Content-Type %q, Link %q: want application/json and the type URI", ct, a.header.Get("Link"))
	}
}

func TestParseEnvelopeTemplate(t *testing.T) {
	for _, tc := range []struct {
		tmpl string
		ok   bool
	}{
		{`{"error":{"code":"{{code}}","message":"{{detail}}"}}`, true},
		{`{"code":"{{code}}","status":"{{status}}"}`, true},
		{`{"message":"{{detail}}"}`, false},                   // no errorCode
		{`{"code":"{{code}}","message":"{{detial}}"}`, false}, // a typo
		{`["{{code}}"]`, false},                               // not an object
		{`{"code":"{{code}}","code":"x"}`, false},             // duplicate name
		{`{"code":"{{code}}"`, false},                         // not JSON
		{`{"code":"{{code}}"} {}`, false},                     // two values
		{`{"{{code}}":"x"}`, false},                           // a name is not substituted
	} {
		env, err := sidecar.ParseEnvelopeTemplate([]byte(tc.tmpl))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.tmpl, err, tc.ok)
			continue
		}
		if err != nil {
			continue
		}
		// Values are JSON-escaped.
		ct, b := env(idemhttp.Problem{Type: "https://x/y", Title: "T", Status: 409, Detail: `say "hi" \ </script>`, ErrorCode: "C"})
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil || ct != "application/json" {
			t.Errorf("%s renders %s (%s): %v", tc.tmpl, b, ct, err)
		}
	}
}

func TestEnvelopeFileMissing(t *testing.T) {
	st, _ := storetest.New(t)
	routes, err := sidecar.ParseRoutes("POST /charges=create_charge@http://127.0.0.1:1;error-envelope-file=" + filepath.Join(t.TempDir(), "none.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sidecar.New(engine.New(st, engine.Options{}), sidecar.Options{Routes: routes}); err == nil {
		t.Error("sidecar.New accepted a route whose envelope file does not exist")
	}
}

// FuzzParseEnvelopeTemplate: a template is accepted only when it renders a
// JSON object holding the errorCode, and then renders one for any problem,
// whatever its text holds.
func FuzzParseEnvelopeTemplate(f *testing.F) {
	f.Add([]byte(`{"error":{"code":"{{code}}","message":"{{detail}}","status":"{{status}}"}}`), `say "hi" \ {{code}}`)
	f.Add([]byte(`{"errors":[{"c":"{{code}}","t":"{{title}} at {{type}}","n":[1,2.5,null,true]}]}`), "\u2028")
	f.Add([]byte(`{"code":"{{code}}"} {}`), "")
	f.Add([]byte(`{"{{code}}":"{{code}}"}`), "x")
	f.Fuzz(func(t *testing.T, tmpl []byte, detail string) {
		env, err := sidecar.ParseEnvelopeTemplate(tmpl)
		if err != nil {
			return
		}
		code := "IDEMPOTENCY_REQUEST_IN_PROGRESS"
		ct, b := env(idemhttp.Problem{Type: "https://x/y", Title: "T", Status: 409, Detail: detail, Message: detail, ErrorCode: code})
		var v map[string]any
		if ct != "application/json" || json.Unmarshal(b, &v) != nil || !strings.Contains(string(b), code) {
			t.Errorf("template %q renders %q (%s): want a JSON object holding the code", tmpl, b, ct)
		}
	})
}

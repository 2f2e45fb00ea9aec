package sidecar_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	stripewebhook "github.com/stripe/stripe-go/v84/webhook"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

// eventUpstream is the receiver behind the webhook routes: it counts
// executions by path and derived key.
type eventUpstream struct {
	url string
	mu  sync.Mutex
	// runs by path and derived key.
	runs    map[string]int
	headers []http.Header
	// status answers every request (default 200).
	status int
}

func newEventUpstream(t *testing.T) *eventUpstream {
	t.Helper()
	u := &eventUpstream{runs: map[string]int{}, status: http.StatusOK}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.runs[r.URL.Path+" "+r.Header.Get("Idempotency-Key")]++
		u.headers = append(u.headers, r.Header.Clone())
		n, status := len(u.headers), u.status
		u.mu.Unlock()
		// Slow enough that concurrent redeliveries find the first in
		// progress.
		time.Sleep(50 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"handled":%d,"bytes":%d}`, n, len(body))
	}))
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

func (u *eventUpstream) executions() (map[string]int, []http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	runs := map[string]int{}
	for k, v := range u.runs {
		runs[k] = v
	}
	return runs, append([]http.Header(nil), u.headers...)
}

// standardSecret is a new Standard Webhooks secret: whsec_ and base64.
func standardSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// stripeSecret is a new Stripe endpoint secret.
func stripeSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.RawURLEncoding.EncodeToString(b)
}

// secretsFile writes secrets, one a line, to a new file of mode 0600.
func secretsFile(t *testing.T, secrets ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(path, []byte("# signing secrets\n"+strings.Join(secrets, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// signStandard is what a Standard Webhooks sender sends with body: the
// library's signature over id, ts and body with secret.
func signStandard(t *testing.T, secret, id string, ts time.Time, body string) http.Header {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return h
}

// signStripe is what Stripe sends with body: stripe-go's test signing.
func signStripe(secret string, ts time.Time, body string) http.Header {
	p := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: []byte(body), Secret: secret, Timestamp: ts})
	h := http.Header{}
	h.Set("Stripe-Signature", p.Header)
	return h
}

// stripeEvent is a Stripe event's body; pending is its pending_webhooks,
// which Stripe updates between deliveries.
func stripeEvent(id string, amount, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","api_version":"2025-09-30.clover","created":1760000000,"type":"charge.succeeded",`+
		`"data":{"object":{"id":"ch_1","object":"charge","amount":%d,"currency":"eur"}},"livemode":false,"pending_webhooks":%d,`+
		`"request":{"id":null,"idempotency_key":null}}`, id, amount, pending)
}

type hookFixture struct {
	st  *store.Store
	url string
	up  *eventUpstream
	reg *prometheus.Registry
}

// newHookFixture serves the routes, whose {up} is the upstream's URL.
func newHookFixture(t *testing.T, up *eventUpstream, st *store.Store, routes string) *hookFixture {
	t.Helper()
	rts, err := sidecar.ParseRoutes(strings.ReplaceAll(routes, "{up}", up.url))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics, err := idemprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sidecar.New(engine.New(st, engine.Options{}), sidecar.Options{Routes: rts, Metrics: metrics, MaxBodyBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(p)
	t.Cleanup(hs.Close)
	return &hookFixture{st: st, url: hs.URL, up: up, reg: reg}
}

func (f *hookFixture) deliver(t *testing.T, path string, h http.Header, body string) answer {
	t.Helper()
	return deliverTo(t, f.url, path, h, body)
}

func deliverTo(t *testing.T, base, path string, h http.Header, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func (f *hookFixture) rejected(t *testing.T, operation, reason string) float64 {
	t.Helper()
	return counter(t, f.reg, "idem_sidecar_webhook_rejected_total", map[string]string{"operation": operation, "reason": reason})
}

func recordCount(t *testing.T, st *store.Store) int {
	t.Helper()
	return storetest.Count(t, st, `SELECT count(*) FROM idempotency_records`)
}

// hookRoutes are a Standard Webhooks route at /hooks/standard and a Stripe
// route at /hooks/stripe, both of tenant-a, holding a redelivery that
// finds the first in progress until it is answered.
func hookRoutes(standardFile, stripeFile, extra string) string {
	return "POST /hooks/standard=receive_standard@{up};webhook=standard;webhook-secret-file=" + standardFile + ";webhook-tenant=tenant-a;wait=10s" + extra +
		",POST /hooks/stripe=receive_stripe@{up};webhook=stripe;webhook-secret-file=" + stripeFile + ";webhook-tenant=tenant-a;wait=10s" + extra
}

func TestParseWebhookRoutes(t *testing.T) {
	routes, err := sidecar.ParseRoutes("POST /hooks=receive@http://h;webhook=standard;webhook-secret-file=/run/secrets/hooks;webhook-tenant=acme;webhook-tolerance=2m;window=96h," +
		"POST /stripe=receive_stripe@http://h;webhook=stripe;webhook-secret-file=/s;webhook-tenant=acme")
	if err != nil {
		t.Fatal(err)
	}
	r := routes[0]
	if r.Webhook != sidecar.WebhookStandard || r.WebhookSecretFile != "/run/secrets/hooks" || r.WebhookTenant != "acme" ||
		r.WebhookTolerance != 2*time.Minute || r.Window != 96*time.Hour {
		t.Errorf("route = %+v", r)
	}
	for _, r := range routes {
		again, err := sidecar.ParseRoutes(r.String())
		if err != nil || !reflect.DeepEqual(again[0], r) {
			t.Errorf("%q parses back to %+v, %v", r.String(), again, err)
		}
	}
	for _, s := range []string{
		"POST /t=op@http://h;webhook=github;webhook-secret-file=/s;webhook-tenant=a",
		"POST /t=op@http://h;webhook=standard;webhook-tenant=a",                                         // no secrets
		"POST /t=op@http://h;webhook=standard;webhook-secret-file=/s",                                   // no tenant
		"POST /t=op@http://h;webhook=standard;webhook-secret-file=/s;webhook-tenant=a b",                // not a tenant name
		"PUT /t=op@http://h;webhook=standard;webhook-secret-file=/s;webhook-tenant=a",                   // not POST
		"POST /t=op@http://h;webhook=standard;webhook-secret-file=/s;webhook-tenant=a;key-field=/id",    // the key is webhook-id
		"POST /t=op@http://h;webhook=stripe;webhook-secret-file=/s;webhook-tenant=a;key-field=/data/id", // the key is the event's id
		"POST /t=op@http://h;webhook=standard;webhook=stripe;webhook-secret-file=/s;webhook-tenant=a",
		"POST /t=op@http://h;webhook=standard;webhook-secret-file=/s;webhook-tenant=a;webhook-tolerance=0s",
		"POST /t=op@http://h;webhook=standard;webhook-secret-file=/s;webhook-tenant=a;webhook-tolerance=2h",
		"POST /t=op@http://h;webhook-secret-file=/s", // without webhook=
		"POST /t=op@http://h;webhook-tenant=a",       // without webhook=
		"POST /t=op@http://h;webhook-tolerance=1m",   // without webhook=
		"POST /t=op@http://h;webhook",                // no kind
		"POST /t=op@http://h;webhooks=standard",      // no such option
		"POST /t=op@http://h;window=0s", "POST /t=op@http://h;window=721h",
	} {
		if _, err := sidecar.ParseRoutes(s); err == nil {
			t.Errorf("ParseRoutes(%q) accepted", s)
		}
	}
}

// TestWebhookRedeliveriesExecuteOnce: a Standard Webhooks sender and a
// Stripe sender each deliver one event five times at once, every delivery
// signed anew with its own timestamp (and the Stripe event with another
// pending_webhooks), then once more: the upstream executes each event
// once, under the derived key of the route's tenant and the event's id,
// and every delivery gets the first answer. The record's window is the
// sender's retry horizon.
func TestWebhookRedeliveriesExecuteOnce(t *testing.T) {
	st, _ := storetest.New(t)
	stdSecret, stripeSec := standardSecret(t), stripeSecret(t)
	f := newHookFixture(t, newEventUpstream(t), st, hookRoutes(secretsFile(t, stdSecret), secretsFile(t, stripeSec), ""))
	const stdID, stripeID = "msg_2LJTPXNkXFzQwXhGy5iSz4cXbWZ", "evt_1QxWebhookRedelivered"
	stdBody := `{"type":"invoice.paid","timestamp":"2026-12-04T10:00:00Z","data":{"invoice":"in_1","amount":"12.00"}}`
	now := time.Now()

	answers := make([]answer, 10)
	var wg sync.WaitGroup
	for i := range 5 {
		// Each delivery is signed at its own time, as a sender re-signs
		// a redelivery.
		ts := now.Add(-time.Duration(i*30) * time.Second)
		wg.Go(func() {
			answers[i] = f.deliver(t, "/hooks/standard", signStandard(t, stdSecret, stdID, ts, stdBody), stdBody)
		})
		body := stripeEvent(stripeID, 2000, 5-i)
		wg.Go(func() { answers[5+i] = f.deliver(t, "/hooks/stripe", signStripe(stripeSec, ts, body), body) })
	}
	wg.Wait()
	std := f.deliver(t, "/hooks/standard", signStandard(t, stdSecret, stdID, time.Now(), stdBody), stdBody)
	body := stripeEvent(stripeID, 2000, 0)
	stripe := f.deliver(t, "/hooks/stripe", signStripe(stripeSec, time.Now(), body), body)
	for i, a := range append(answers, std, stripe) {
		first := answers[0]
		if i >= 5 && i != 10 {
			first = answers[5]
		}
		if a.status != http.StatusOK || a.body != first.body {
			t.Errorf("delivery %d: %d %s, want 200 %s", i, a.status, a.body, first.body)
		}
	}
	if std.header.Get("Idempotent-Replayed") != "true" || stripe.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("redeliveries not replays: %v %v", std.header, stripe.header)
	}
	runs, headers := f.up.executions()
	want := map[string]int{
		"/hooks/standard " + sidecar.DerivedKey("tenant-a", "receive_standard", stdID, 0): 1,
		"/hooks/stripe " + sidecar.DerivedKey("tenant-a", "receive_stripe", stripeID, 0):  1,
	}
	if !reflect.DeepEqual(runs, want) {
		t.Errorf("upstream executions %v, want %v", runs, want)
	}
	for _, h := range headers {
		if h.Get("Idem-Tenant") != "tenant-a" {
			t.Errorf("upstream got tenant %q", h.Get("Idem-Tenant"))
		}
	}
	for op, key := range map[string]string{"receive_standard": stdID, "receive_stripe": stripeID} {
		rec, err := st.Get(context.Background(), idem.Scope{Tenant: "tenant-a", Operation: op, Key: key})
		if err != nil {
			t.Fatalf("record of %s: %v", op, err)
		}
		if w := rec.ExpiresAt.Sub(rec.CreatedAt); rec.Status != idem.StatusCompleted || w != sidecar.DefaultWebhookWindow {
			t.Errorf("record of %s: %s, window %v; want COMPLETED, %v", op, rec.Status, w, sidecar.DefaultWebhookWindow)
		}
	}

	// Another event under the same id is the id reused: refused, never
	// executed.
	other := stripeEvent(stripeID, 9999, 0)
	if a := f.deliver(t, "/hooks/stripe", signStripe(stripeSec, time.Now(), other), other); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
		t.Errorf("another event under the same id: %d %s", a.status, a.body)
	}
	otherStd := strings.Replace(stdBody, "12.00", "13.00", 1)
	if a := f.deliver(t, "/hooks/standard", signStandard(t, stdSecret, stdID, time.Now(), otherStd), otherStd); a.status != http.StatusConflict || a.code() != idem.ECodeKeyReused {
		t.Errorf("another message under the same webhook-id: %d %s", a.status, a.body)
	}
	if runs, _ := f.up.executions(); !reflect.DeepEqual(runs, want) {
		t.Errorf("upstream executions after the reuses %v, want %v", runs, want)
	}
}

// TestWebhookBadSignaturesStoreNothing: a forged, tampered, unsigned,
// expired or future-dated delivery, of either kind, answers 401
// WEBHOOK_SIGNATURE_INVALID, counted by reason, and stores nothing: no
// record, no upstream call, and the genuine event delivered afterwards
// executes as a first delivery.
func TestWebhookBadSignaturesStoreNothing(t *testing.T) {
	st, _ := storetest.New(t)
	stdSecret, stripeSec := standardSecret(t), stripeSecret(t)
	f := newHookFixture(t, newEventUpstream(t), st, hookRoutes(secretsFile(t, stdSecret), secretsFile(t, stripeSec), ""))
	const id = "msg_forged"
	body := `{"type":"payout.paid","data":{"amount":100}}`
	event := stripeEvent("evt_forged", 100, 1)
	now := time.Now()
	tampered := signStandard(t, stdSecret, id, now, body)
	multi := signStandard(t, stdSecret, id, now, body)
	multi.Add(standardwebhooks.HeaderWebhookID, "msg_other")
	bearer := signStandard(t, standardSecret(t), id, now, body)
	bearer.Set("Authorization", "Bearer tok-a")
	cases := []struct {
		name, path, op, reason string
		header                 http.Header
		body                   string
	}{
		{"standard: another secret", "/hooks/standard", "receive_standard", "mismatch", signStandard(t, standardSecret(t), id, now, body), body},
		{"standard: a bearer token instead", "/hooks/standard", "receive_standard", "mismatch", bearer, body},
		{"standard: tampered body", "/hooks/standard", "receive_standard", "mismatch", tampered, strings.Replace(body, "100", "1000", 1)},
		{"standard: another id", "/hooks/standard", "receive_standard", "mismatch", func() http.Header {
			h := signStandard(t, stdSecret, id, now, body)
			h.Set(standardwebhooks.HeaderWebhookID, "msg_other")
			return h
		}(), body},
		{"standard: expired", "/hooks/standard", "receive_standard", "stale", signStandard(t, stdSecret, id, now.Add(-10*time.Minute), body), body},
		{"standard: future", "/hooks/standard", "receive_standard", "stale", signStandard(t, stdSecret, id, now.Add(10*time.Minute), body), body},
		{"standard: unsigned", "/hooks/standard", "receive_standard", "unsigned", http.Header{standardwebhooks.HeaderWebhookID: {id}}, body},
		{"standard: two ids", "/hooks/standard", "receive_standard", "malformed", multi, body},
		{"standard: bad timestamp", "/hooks/standard", "receive_standard", "malformed", func() http.Header {
			h := signStandard(t, stdSecret, id, now, body)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, "yesterday")
			return h
		}(), body},
		{"stripe: another secret", "/hooks/stripe", "receive_stripe", "mismatch", signStripe(stripeSecret(t), now, event), event},
		{"stripe: tampered body", "/hooks/stripe", "receive_stripe", "mismatch", signStripe(stripeSec, now, event), strings.Replace(event, "100", "1000", 1)},
		{"stripe: expired", "/hooks/stripe", "receive_stripe", "stale", signStripe(stripeSec, now.Add(-10*time.Minute), event), event},
		{"stripe: future", "/hooks/stripe", "receive_stripe", "stale", signStripe(stripeSec, now.Add(10*time.Minute), event), event},
		{"stripe: unsigned", "/hooks/stripe", "receive_stripe", "unsigned", http.Header{"Idempotency-Key": {"k"}}, event},
		{"stripe: malformed", "/hooks/stripe", "receive_stripe", "malformed", http.Header{"Stripe-Signature": {"t=now,v1=00"}}, event},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.rejected(t, c.op, c.reason)
			a := f.deliver(t, c.path, c.header, c.body)
			if a.status != http.StatusUnauthorized || a.code() != idem.ECodeWebhookSignatureInvalid {
				t.Errorf("%d %s, want 401 %s", a.status, a.body, idem.ECodeWebhookSignatureInvalid)
			}
			if strings.Contains(a.body, id) || strings.Contains(a.body, "evt_forged") {
				t.Errorf("the answer quotes the request: %s", a.body)
			}
			if got := f.rejected(t, c.op, c.reason); got != before+1 {
				t.Errorf("rejected{%s,%s} = %v, want %v", c.op, c.reason, got, before+1)
			}
		})
	}
	if n := recordCount(t, st); n != 0 {
		t.Errorf("%d records stored for refused deliveries", n)
	}
	if runs, _ := f.up.executions(); len(runs) != 0 {
		t.Errorf("upstream called for refused deliveries: %v", runs)
	}
	if a := f.deliver(t, "/hooks/standard", signStandard(t, stdSecret, id, time.Now(), body), body); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the genuine message after the forgeries: %d %v %s", a.status, a.header, a.body)
	}
	if a := f.deliver(t, "/hooks/stripe", signStripe(stripeSec, time.Now(), event), event); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the genuine event after the forgeries: %d %v %s", a.status, a.header, a.body)
	}
	if n := recordCount(t, st); n != 2 {
		t.Errorf("%d records, want the 2 genuine ones", n)
	}
}

// TestWebhookSecretRotation: during a rotation the file holds the old and
// the new secret, and deliveries signed with either are accepted (a
// redelivery signed with the new one replays the answer to the old one);
// once the old secret leaves the file (read again when the proxy starts),
// a delivery signed with it is refused and stores nothing.
func TestWebhookSecretRotation(t *testing.T) {
	st, _ := storetest.New(t)
	up := newEventUpstream(t)
	oldStd, newStd, oldStripe, newStripe := standardSecret(t), standardSecret(t), stripeSecret(t), stripeSecret(t)
	stdFile, stripeFile := secretsFile(t, oldStd, newStd), secretsFile(t, oldStripe, newStripe)
	f := newHookFixture(t, up, st, hookRoutes(stdFile, stripeFile, ""))
	body := `{"type":"ping"}`
	event := stripeEvent("evt_rotated", 1, 1)
	for _, secret := range []string{oldStd, newStd} {
		if a := f.deliver(t, "/hooks/standard", signStandard(t, secret, "msg_rotated", time.Now(), body), body); a.status != http.StatusOK {
			t.Errorf("standard, rotation under way: %d %s", a.status, a.body)
		}
	}
	for _, secret := range []string{oldStripe, newStripe} {
		if a := f.deliver(t, "/hooks/stripe", signStripe(secret, time.Now(), event), event); a.status != http.StatusOK {
			t.Errorf("stripe, rotation under way: %d %s", a.status, a.body)
		}
	}
	if runs, _ := up.executions(); len(runs) != 2 {
		t.Errorf("upstream executions %v, want one per event", runs)
	}

	// The rotation ends: the old secret leaves the file, and the proxy
	// starts again.
	for file, secret := range map[string]string{stdFile: newStd, stripeFile: newStripe} {
		if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f = newHookFixture(t, up, st, hookRoutes(stdFile, stripeFile, ""))
	if a := f.deliver(t, "/hooks/standard", signStandard(t, oldStd, "msg_late", time.Now(), body), body); a.status != http.StatusUnauthorized {
		t.Errorf("standard, old secret after the rotation: %d %s", a.status, a.body)
	}
	late := stripeEvent("evt_late", 1, 1)
	if a := f.deliver(t, "/hooks/stripe", signStripe(oldStripe, time.Now(), late), late); a.status != http.StatusUnauthorized {
		t.Errorf("stripe, old secret after the rotation: %d %s", a.status, a.body)
	}
	if f.rejected(t, "receive_standard", "mismatch") != 1 || f.rejected(t, "receive_stripe", "mismatch") != 1 {
		t.Error("the refusals after the rotation are not counted as mismatches")
	}
	if n := recordCount(t, st); n != 2 {
		t.Errorf("%d records, want the 2 of the rotation", n)
	}
	if a := f.deliver(t, "/hooks/standard", signStandard(t, newStd, "msg_rotated", time.Now(), body), body); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("standard, new secret after the rotation: %d %s", a.status, a.body)
	}
}

// TestWebhookToleranceAndWindowOptions: webhook-tolerance bounds the signed
// timestamp's distance from the clock, and window replaces the default
// window.
func TestWebhookToleranceAndWindowOptions(t *testing.T) {
	st, _ := storetest.New(t)
	secret := standardSecret(t)
	f := newHookFixture(t, newEventUpstream(t), st, "POST /hooks=receive@{up};webhook=standard;webhook-secret-file="+secretsFile(t, secret)+
		";webhook-tenant=tenant-a;webhook-tolerance=1m;window=48h")
	body := `{"type":"ping"}`
	if a := f.deliver(t, "/hooks", signStandard(t, secret, "msg_1", time.Now().Add(-2*time.Minute), body), body); a.status != http.StatusUnauthorized {
		t.Errorf("signed 2m ago, tolerance 1m: %d %s", a.status, a.body)
	}
	if a := f.deliver(t, "/hooks", signStandard(t, secret, "msg_1", time.Now().Add(-30*time.Second), body), body); a.status != http.StatusOK {
		t.Errorf("signed 30s ago, tolerance 1m: %d %s", a.status, a.body)
	}
	rec, err := st.Get(context.Background(), idem.Scope{Tenant: "tenant-a", Operation: "receive", Key: "msg_1"})
	if err != nil {
		t.Fatal(err)
	}
	if w := rec.ExpiresAt.Sub(rec.CreatedAt); w != 48*time.Hour {
		t.Errorf("window %v, want 48h", w)
	}
}

// TestWebhookBodyOverLimit: a delivery over the body limit is 413 before
// its signature is checked, and stores nothing.
func TestWebhookBodyOverLimit(t *testing.T) {
	st, _ := storetest.New(t)
	secret := standardSecret(t)
	f := newHookFixture(t, newEventUpstream(t), st, "POST /hooks=receive@{up};webhook=standard;webhook-secret-file="+secretsFile(t, secret)+";webhook-tenant=tenant-a")
	body := `{"pad":"` + strings.Repeat("x", 8<<10) + `"}`
	if a := f.deliver(t, "/hooks", signStandard(t, secret, "msg_big", time.Now(), body), body); a.status != http.StatusRequestEntityTooLarge || a.code() != idem.ECodeBodyTooLarge {
		t.Errorf("%d %s, want 413", a.status, a.body)
	}
	if n := recordCount(t, st); n != 0 {
		t.Errorf("%d records", n)
	}
}

// TestWebhookSecretsFileRefused: a route whose secrets file is missing,
// empty or holds a secret the library cannot read does not start, and the
// error names no secret.
func TestWebhookSecretsFileRefused(t *testing.T) {
	st, _ := storetest.New(t)
	empty := secretsFile(t)
	bad := secretsFile(t, "whsec_not*base64")
	for _, file := range []string{filepath.Join(t.TempDir(), "absent"), empty, bad} {
		rts, err := sidecar.ParseRoutes("POST /hooks=receive@http://127.0.0.1:1;webhook=standard;webhook-tenant=tenant-a;webhook-secret-file=" + file)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sidecar.New(engine.New(st, engine.Options{}), sidecar.Options{Routes: rts})
		if err == nil {
			t.Errorf("secrets file %s accepted", file)
		} else if strings.Contains(err.Error(), "not*base64") {
			t.Errorf("the error quotes a secret: %v", err)
		}
	}
}

package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

var tokens = map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"}

type fixture struct {
	eng *engine.Engine
	st  *store.Store
	up  *upstream
	url string
	reg *prometheus.Registry
}

// newFixture serves one route, POST /transfers as create_transfer, in front
// of a test upstream; options are appended to the route.
func newFixture(t *testing.T, options string) *fixture {
	t.Helper()
	up := newUpstream(t)
	return newFixtureTo(t, up, up.url, options)
}

func newFixtureTo(t *testing.T, up *upstream, upstreamURL, options string) *fixture {
	t.Helper()
	return newFixtureWith(t, up, upstreamURL, options, engine.Options{})
}

// newFixtureWith is newFixtureTo with an engine of eopts.
func newFixtureWith(t *testing.T, up *upstream, upstreamURL, options string, eopts engine.Options) *fixture {
	t.Helper()
	st, _ := storetest.New(t)
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + upstreamURL + strings.ReplaceAll(options, "{up}", up.url))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics, err := idemprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, eopts)
	p, err := sidecar.New(eng, sidecar.Options{
		Routes:  routes,
		Metrics: metrics,
		Tenant: func(r *http.Request) (string, error) {
			token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if tenant := tokens[token]; tenant != "" {
				return tenant, nil
			}
			return "", errors.New("unknown token")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(p)
	t.Cleanup(hs.Close)
	return &fixture{eng: eng, st: st, up: up, url: hs.URL, reg: reg}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) code() string {
	var e struct{ ErrorCode string }
	_ = json.Unmarshal([]byte(a.body), &e)
	return e.ErrorCode
}

func (f *fixture) post(t *testing.T, token, key, path, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func (f *fixture) record(t *testing.T, tenant, key string) *idem.Record {
	t.Helper()
	rec, err := f.st.Get(context.Background(), idem.Scope{Tenant: tenant, Operation: "create_transfer", Key: key})
	if err != nil {
		t.Fatalf("record %s/%s: %v", tenant, key, err)
	}
	return rec
}

func (f *fixture) calls(t *testing.T, call, result string) float64 {
	t.Helper()
	return counter(t, f.reg, "idem_sidecar_upstream_calls_total", map[string]string{"operation": "create_transfer", "call": call, "result": result})
}

// counter is the value of the counter name{labels} in reg (every label
// named, others ignored); the test fails when there is none.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			for k, v := range labels {
				if l[k] != v {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

const transfer = `{"amount": "10.00", "to": "acc_2"}`

// TestProxyExecutesOnceAndReplays: the upstream gets the client's method,
// path, query and body, the derived key, the tenant and a fencing token,
// and neither the bearer token nor hop-by-hop or Idem-* headers; the retry
// is the first answer byte for byte, without a second execution.
func TestProxyExecutesOnceAndReplays(t *testing.T) {
	f := newFixture(t, "")
	first := f.post(t, "tok-a", "k1", "/transfers/acc_1?b=2&a=1", transfer,
		"Connection", "X-Hop", "X-Hop", "1", "Idem-Tenant", "forged", "Idem-Forwarded-By", "x", "X-Kept", "yes", "Accept-Encoding", "gzip")
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" || first.header.Get("X-Upstream") != "1" ||
		first.header.Get("Idempotency-Window") != "86400" {
		t.Fatalf("first = %+v", first)
	}
	h := f.up.lastHeader()
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "k1", 0)
	if got := h.Get("Idempotency-Key"); got != derived {
		t.Errorf("upstream Idempotency-Key = %q, want %q", got, derived)
	}
	if h.Get("Idem-Tenant") != "tenant-a" || h.Get("Idem-Fencing-Token") == "" || h.Get("Idem-Fencing-Token") == "0" {
		t.Errorf("upstream Idem-Tenant %q, Idem-Fencing-Token %q", h.Get("Idem-Tenant"), h.Get("Idem-Fencing-Token"))
	}
	for _, name := range []string{"Authorization", "X-Hop", "Idem-Forwarded-By", "Accept-Encoding"} {
		if v := h.Values(name); len(v) > 0 {
			t.Errorf("upstream received %s: %q", name, v)
		}
	}
	if h.Get("X-Kept") != "yes" || h.Get("Content-Type") != "application/json" {
		t.Errorf("upstream lost the client's headers: %v", h)
	}
	if f.up.uris[0] != "POST /transfers/acc_1?b=2&a=1" || f.up.bodies[0] != transfer {
		t.Errorf("upstream got %q %q", f.up.uris[0], f.up.bodies[0])
	}
	// The same command: query in another order, body respaced.
	second := f.post(t, "tok-a", "k1", "/transfers/acc_1?a=1&b=2", `{"to":"acc_2","amount":"10.00"}`)
	if second.status != first.status || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" ||
		second.header.Get("Location") != first.header.Get("Location") || second.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay = %+v, want %+v", second, first)
	}
	if n := f.up.total(); n != 1 {
		t.Errorf("upstream executions = %d, want 1", n)
	}
	if rec := f.record(t, "tenant-a", "k1"); rec.Status != idem.StatusCompleted {
		t.Errorf("record %s", rec.Status)
	}
}

// TestTenantsNeverShareDerivedKey: two tenants with one client key are two
// executions under two derived keys; the length prefixes keep shifted
// boundaries apart.
func TestTenantsNeverShareDerivedKey(t *testing.T) {
	f := newFixture(t, "")
	a := f.post(t, "tok-a", "same", "/transfers", transfer)
	b := f.post(t, "tok-b", "same", "/transfers", transfer)
	if a.status != 201 || b.status != 201 || a.body == b.body {
		t.Fatalf("a = %+v, b = %+v", a, b)
	}
	e, _ := f.up.counts()
	ka, kb := sidecar.DerivedKey("tenant-a", "create_transfer", "same", 0), sidecar.DerivedKey("tenant-b", "create_transfer", "same", 0)
	if ka == kb || e[ka] != 1 || e[kb] != 1 {
		t.Errorf("executions %v, keys %s %s", e, ka, kb)
	}
	for _, pair := range [][2][3]string{
		{{"ab", "c", "k"}, {"a", "bc", "k"}},
		{{"t", "op", "k"}, {"t", "o", "pk"}},
	} {
		if sidecar.DerivedKey(pair[0][0], pair[0][1], pair[0][2], 0) == sidecar.DerivedKey(pair[1][0], pair[1][1], pair[1][2], 0) {
			t.Errorf("%v and %v share a derived key", pair[0], pair[1])
		}
	}
	if sidecar.DerivedKey("t", "o", "k", 0) == sidecar.DerivedKey("t", "o", "k", 1) {
		t.Error("two generations share a derived key")
	}
}

// TestRefusedBeforeUpstream: a missing or invalid key is 400, another body
// or query with the same key is 409, and the upstream is not called.
func TestRefusedBeforeUpstream(t *testing.T) {
	f := newFixture(t, "")
	if a := f.post(t, "tok-a", "", "/transfers", transfer); a.status != 400 || a.code() != idem.ECodeKeyMissing {
		t.Errorf("missing key: %+v", a)
	}
	if a := f.post(t, "tok-a", strings.Repeat("k", 256), "/transfers", transfer); a.status != 400 || a.code() != idem.ECodeKeyInvalid {
		t.Errorf("invalid key: %+v", a)
	}
	if a := f.post(t, "nope", "k", "/transfers", transfer); a.status != 401 {
		t.Errorf("bad token: %+v", a)
	}
	if n := f.up.total(); n != 0 {
		t.Fatalf("upstream executions = %d before any valid request", n)
	}
	if a := f.post(t, "tok-a", "k", "/transfers?x=1", transfer); a.status != 201 {
		t.Fatalf("first: %+v", a)
	}
	for _, c := range []struct{ path, body string }{
		{"/transfers?x=1", `{"amount":"11.00","to":"acc_2"}`},
		{"/transfers?x=2", transfer},
		{"/transfers/other?x=1", transfer},
	} {
		if a := f.post(t, "tok-a", "k", c.path, c.body); a.status != 409 || a.code() != idem.ECodeKeyReused {
			t.Errorf("%s %s: %+v, want 409 %s", c.path, c.body, a, idem.ECodeKeyReused)
		}
	}
	if n := f.up.total(); n != 1 {
		t.Errorf("upstream executions = %d, want 1", n)
	}
}

// TestUpstream5xxRetriesWithSameDerivedKey: a 5xx is answered, not stored;
// the retry executes again and the upstream sees the same derived key.
func TestUpstream5xxRetriesWithSameDerivedKey(t *testing.T) {
	f := newFixture(t, "")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "k5", 0)
	f.up.fail[derived] = 1
	if a := f.post(t, "tok-a", "k5", "/transfers", transfer); a.status != 503 || a.body != `{"error":"try again"}` {
		t.Fatalf("first = %+v, want the upstream's 503", a)
	}
	if rec := f.record(t, "tenant-a", "k5"); rec.Status != idem.StatusFailedRetryable || rec.ErrorCode != "HTTP_503" {
		t.Fatalf("record after 5xx: %s %s, want %s HTTP_503", rec.Status, rec.ErrorCode, idem.StatusFailedRetryable)
	}
	if a := f.post(t, "tok-a", "k5", "/transfers", transfer); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry = %+v", a)
	}
	e, r := f.up.counts()
	if r[derived] != 2 || e[derived] != 1 || len(r) != 1 {
		t.Errorf("received %v, executed %v; want 2 requests under %s", r, e, derived)
	}
}

// TestUpstream4xxIsReplayed: a 4xx other than 408/409/425/429 is final.
func TestUpstream4xxIsReplayed(t *testing.T) {
	f := newFixture(t, "")
	f.up.failStatus = http.StatusUnprocessableEntity
	f.up.fail[sidecar.DerivedKey("tenant-a", "create_transfer", "k4", 0)] = 1
	first := f.post(t, "tok-a", "k4", "/transfers", transfer)
	second := f.post(t, "tok-a", "k4", "/transfers", transfer)
	if first.status != 422 || second.status != 422 || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %+v, second %+v", first, second)
	}
	if _, r := f.up.counts(); len(r) != 1 || f.up.total() != 0 {
		t.Errorf("upstream received %v", r)
	}
	if rec := f.record(t, "tenant-a", "k4"); rec.Status != idem.StatusFailedReplayable || rec.ErrorCode != "HTTP_422" {
		t.Errorf("record %s %s, want %s HTTP_422", rec.Status, rec.ErrorCode, idem.StatusFailedReplayable)
	}
}

// TestUpstreamUnreachableIsRetryable: nothing was written, so the answer is
// 503 UNAVAILABLE and the record is released.
func TestUpstreamUnreachableIsRetryable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	_ = ln.Close()
	f := newFixtureTo(t, newUpstream(t), dead, "")
	a := f.post(t, "tok-a", "ku", "/transfers", transfer)
	if a.status != 503 || a.code() != idem.ECodeUnavailable {
		t.Fatalf("answer %+v", a)
	}
	if rec := f.record(t, "tenant-a", "ku"); rec.Status != idem.StatusFailedRetryable || rec.Checkpoint != idem.CheckpointReceived {
		t.Errorf("record %s at %s", rec.Status, rec.Checkpoint)
	}
	if got := f.calls(t, "execute", "not_sent"); got != 1 {
		t.Errorf("not_sent = %v", got)
	}
}

// TestLostAnswerResolvedByLookup: the upstream executed but the answer was
// lost: 202 OUTCOME_UNKNOWN, then the retry asks the lookup, which
// settles the record without a second execution.
func TestLostAnswerResolvedByLookup(t *testing.T) {
	f := newFixture(t, ";lookup={up}/transfers/by-key/{derivedKey}")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kl", 0)
	f.up.hangUp[derived] = true
	a := f.post(t, "tok-a", "kl", "/transfers", transfer)
	if a.status != http.StatusAccepted || a.code() != idem.ECodeOutcomeUnknown {
		t.Fatalf("lost answer: %+v", a)
	}
	// The same code a recovery that cannot tell records, not the HTTP
	// status of the proxy's own 202.
	if rec := f.record(t, "tenant-a", "kl"); rec.Status != idem.StatusUnknown || rec.ErrorCode != idem.ECodeOutcomeUnknown {
		t.Fatalf("record %s %s, want %s %s", rec.Status, rec.ErrorCode, idem.StatusUnknown, idem.ECodeOutcomeUnknown)
	}
	b := f.post(t, "tok-a", "kl", "/transfers", transfer)
	if b.status != 200 || !strings.Contains(b.body, `"tenant":"tenant-a"`) {
		t.Fatalf("after lookup: %+v", b)
	}
	c := f.post(t, "tok-a", "kl", "/transfers", transfer)
	if c.body != b.body || c.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %+v, want %+v", c, b)
	}
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 1 {
		t.Errorf("executions %v, received %v", e, r)
	}
	if rec := f.record(t, "tenant-a", "kl"); rec.Status != idem.StatusCompleted {
		t.Errorf("record %s", rec.Status)
	}
}

// TestLookupNotFoundReleases: a lookup that finds nothing releases the
// record; the next retry executes with the same derived key.
func TestLookupNotFoundReleases(t *testing.T) {
	up := newUpstream(t)
	// The lookup asks a path the upstream does not know.
	f := newFixtureTo(t, up, up.url, ";lookup={up}/nowhere/{derivedKey}?x=1")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kn", 0)
	// The upstream drops the connection; its lookup knows nothing of the
	// key (as if the execution never committed).
	up.hangUp[derived] = true
	if a := f.post(t, "tok-a", "kn", "/transfers", transfer); a.status != http.StatusAccepted {
		t.Fatalf("lost: %+v", a)
	}
	if a := f.post(t, "tok-a", "kn", "/transfers", transfer); a.status != 503 || a.code() != idem.ECodeUnavailable {
		t.Fatalf("after a lookup 404: %+v", a)
	}
	if a := f.post(t, "tok-a", "kn", "/transfers", transfer); a.status != 201 {
		t.Fatalf("retry: %+v", a)
	}
	if _, r := up.counts(); r[derived] != 2 || len(r) != 1 {
		t.Errorf("received %v", r)
	}
}

// TestLostAnswerWithoutRecoveryStaysUnknown: with neither lookup nor an
// idempotent upstream, retries answer 202 and never execute again.
func TestLostAnswerWithoutRecoveryStaysUnknown(t *testing.T) {
	f := newFixture(t, "")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kx", 0)
	f.up.hangUp[derived] = true
	for i := range 3 {
		if a := f.post(t, "tok-a", "kx", "/transfers", transfer); a.status != http.StatusAccepted || a.code() != idem.ECodeOutcomeUnknown {
			t.Fatalf("attempt %d: %+v", i, a)
		}
	}
	if _, r := f.up.counts(); r[derived] != 1 {
		t.Errorf("upstream received %v, want one request", r)
	}
	if rec := f.record(t, "tenant-a", "kx"); rec.Status != idem.StatusUnknown {
		t.Errorf("record %s", rec.Status)
	}
	if got := f.calls(t, "execute", "unknown"); got != 1 {
		t.Errorf("unknown calls = %v", got)
	}
}

// TestLostAnswerResentToIdempotentUpstream: an upstream declared idempotent
// on the key gets the request again, with the same derived key.
func TestLostAnswerResentToIdempotentUpstream(t *testing.T) {
	f := newFixture(t, ";idempotent-upstream")
	f.up.dedup = true
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "ki", 0)
	f.up.hangUp[derived] = true
	if a := f.post(t, "tok-a", "ki", "/transfers", transfer); a.status != http.StatusAccepted {
		t.Fatalf("lost: %+v", a)
	}
	b := f.post(t, "tok-a", "ki", "/transfers", transfer)
	if b.status != 201 {
		t.Fatalf("resend: %+v", b)
	}
	if c := f.post(t, "tok-a", "ki", "/transfers", transfer); c.body != b.body || c.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %+v", c)
	}
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 2 || len(r) != 1 {
		t.Errorf("executions %v, received %v", e, r)
	}
	if got := f.calls(t, "resend", "completed"); got != 1 {
		t.Errorf("resend completed = %v", got)
	}
}

// TestRecoveryPassSettlesByLookup: the recovery pass (no client retry)
// settles a lost answer with the route's lookup; the retry then replays.
func TestRecoveryPassSettlesByLookup(t *testing.T) {
	f := newFixture(t, ";lookup={up}/transfers/by-key/{derivedKey}")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kr", 0)
	f.up.hangUp[derived] = true
	if a := f.post(t, "tok-a", "kr", "/transfers", transfer); a.status != http.StatusAccepted {
		t.Fatalf("lost: %+v", a)
	}
	got, err := f.eng.RecoverStale(context.Background(), 0)
	if err != nil || got[engine.RecoveryCompleted] != 1 {
		t.Fatalf("recovery pass: %v, %v", got, err)
	}
	if rec := f.record(t, "tenant-a", "kr"); rec.Status != idem.StatusCompleted {
		t.Fatalf("record %s", rec.Status)
	}
	if a := f.post(t, "tok-a", "kr", "/transfers", transfer); a.status != 200 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %+v", a)
	}
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 1 {
		t.Errorf("executions %v, received %v", e, r)
	}
}

// TestOversizedBodyNeverReachesUpstream: a body over the limit is 413 and
// stores nothing.
func TestOversizedBodyNeverReachesUpstream(t *testing.T) {
	f := newFixture(t, "")
	big := `{"pad":"` + strings.Repeat("x", 1<<20) + `"}`
	if a := f.post(t, "tok-a", "big", "/transfers", big); a.status != http.StatusRequestEntityTooLarge || a.code() != idem.ECodeBodyTooLarge {
		t.Fatalf("answer %d %s", a.status, a.code())
	}
	if _, r := f.up.counts(); len(r) != 0 {
		t.Errorf("upstream received %v", r)
	}
	if _, err := f.st.Get(context.Background(), idem.Scope{Tenant: "tenant-a", Operation: "create_transfer", Key: "big"}); err == nil {
		t.Error("a record was stored")
	}
}

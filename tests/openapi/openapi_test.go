package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
)

const (
	tenantToken = "tok-a"
	adminToken  = "adm-1"
	operation   = "charge" // the coordination API's operation (--operations)
	// article is a payment command.
	article = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`
)

// proxiedPaths are the paths of the sidecar routes the test sends to (the
// routes' prefixes and a path under one): the document's ProxiedRoute path
// item holds at each route's prefix and every path under it.
var proxiedPaths = []string{"/transfers", "/transfers/tr_1/reverse", "/dead"}

// harness is a node under test and the validators of docs/openapi.yaml.
type harness struct {
	url string
	// doc validates the document's own paths; proxied validates them and
	// the sidecar routes (the ProxiedRoute path item at each prefix).
	doc, proxied validator.Validator
	client       *http.Client
	// provider is the payment provider's simulator, whose faults make the
	// payments API answer a decline, an unknown outcome or a slow charge.
	provider *provider.Client
	checked  map[string]bool // "METHOD /path-template status" answered and validated
	mu       sync.Mutex
}

// exchange is one request and what the node must answer.
type exchange struct {
	name   string
	method string
	path   string
	token  string
	header map[string]string
	body   string
	// conforms: the request is one the document allows; otherwise the
	// document must refuse it (a mistake a client makes), and only the
	// answer is validated.
	conforms bool
	status   int
	code     string // the answer's errorCode ("" for an answer that is no problem)
	// heldAs, when set, is the path the answer is held to: for a request
	// whose path no document can name (an encoded dot segment, refused
	// before routing), the answer of the route it was sent under.
	heldAs string
}

// answer is what the node answered.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("%d %s: %v", a.status, a.body, err)
	}
}

// TestEveryAnswerMatchesOpenAPI sends a real node the requests of every
// documented surface, and the mistakes clients make, and holds each
// request and answer to docs/openapi.yaml with libopenapi-validator.
func TestEveryAnswerMatchesOpenAPI(t *testing.T) {
	h := newHarness(t)
	h.payments(t)
	h.records(t)
	h.coordination(t)
	h.admin(t)
	h.sidecar(t)
	h.operations(t)
	t.Logf("validated %d (path, status) pairs", len(h.checked))
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("docs/openapi.yaml: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("docs/openapi.yaml is not a valid OpenAPI 3.1 document: %v", e)
		}
		t.FailNow()
	}
	// The sidecar's paths are configuration: its contract is one path
	// item, which holds at each route's prefix.
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	item := model.Model.Components.PathItems.GetOrZero("ProxiedRoute")
	if item == nil || item.Post == nil {
		t.Fatal("docs/openapi.yaml has no components.pathItems.ProxiedRoute with a post operation")
	}
	for _, path := range proxiedPaths {
		model.Model.Paths.PathItems.Set(path, item)
	}
	proxied := validator.NewValidatorFromV3Model(&model.Model)

	st, _ := storetest.New(t)
	prov := providertest.Start(t)
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour, LockFor: 30 * time.Second, Provider: prov})
	up := newUpstream(t)
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@" + up.URL + ";timeout=5s, POST /dead=dead_end@http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := region.NewServer(region.Config{
		Region:      "test",
		Addr:        "127.0.0.1:0",
		Tokens:      map[string]string{tenantToken: "tenant-a"},
		AdminTokens: map[string]string{adminToken: "ops"},
		Operations:  []string{operation},
		Registry:    prometheus.NewRegistry(),
		Sidecar:     region.SidecarConfig{Routes: routes},
	}, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("closing the node: %v", err)
		}
	})
	return &harness{url: srv.URL(), doc: v, proxied: proxied, client: client, provider: prov, checked: map[string]bool{}}
}

// newUpstream is the service behind the sidecar routes: it answers 201
// with JSON, after {"delayMs":N} milliseconds, and drops the connection
// without an answer for {"hangUp":true}.
func newUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var cmd struct {
			DelayMs int  `json:"delayMs"`
			HangUp  bool `json:"hangUp"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &cmd)
		time.Sleep(time.Duration(cmd.DelayMs) * time.Millisecond)
		if cmd.HangUp {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":"tr_1","key":%q}`, r.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(up.Close)
	return up
}

// request builds the request of x against base.
func request(t *testing.T, base string, x exchange) *http.Request {
	t.Helper()
	var body io.Reader = http.NoBody
	if x.body != "" {
		body = strings.NewReader(x.body)
	}
	req, err := http.NewRequest(x.method, base+x.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if x.token != "" {
		req.Header.Set("Authorization", "Bearer "+x.token)
	}
	if x.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	return req
}

// do sends x to the node, checks the status and errorCode, and holds the
// request and the answer to the document.
func (h *harness) do(t *testing.T, x exchange) answer {
	t.Helper()
	resp, err := h.client.Do(request(t, h.url, x))
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	var e struct{ ErrorCode string }
	if strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json") {
		_ = json.Unmarshal(b, &e)
	}
	if a.status != x.status || e.ErrorCode != x.code {
		t.Errorf("%s: %s %s answered %d %s, want %d %s", x.name, x.method, x.path, a.status, b, x.status, x.code)
	}
	h.validate(t, x, a)
	return a
}

// validate holds x and a to the document: a conforming request with its
// answer, or, for a request the document refuses, the refusal and the
// answer alone.
func (h *harness) validate(t *testing.T, x exchange, a answer) {
	t.Helper()
	if x.heldAs != "" {
		x.path = x.heldAs
	}
	v := h.doc
	for _, p := range proxiedPaths {
		if x.path == p {
			v = h.proxied
		}
	}
	req := request(t, "http://127.0.0.1:8080", x)
	resp := &http.Response{StatusCode: a.status, Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body)), Request: req}
	var (
		ok   bool
		errs []error
	)
	if x.conforms {
		valid, verrs := v.ValidateHttpRequestResponse(req, resp)
		ok = valid
		for _, e := range verrs {
			errs = append(errs, e)
		}
	} else {
		if valid, _ := v.ValidateHttpRequest(request(t, "http://127.0.0.1:8080", x)); valid {
			t.Errorf("%s: docs/openapi.yaml allows %s %s (%s), which the node refuses with %d %s", x.name, x.method, x.path, x.body, a.status, a.body)
		}
		valid, verrs := v.ValidateHttpResponse(req, resp)
		ok = valid
		for _, e := range verrs {
			errs = append(errs, e)
		}
	}
	if !ok {
		for _, e := range errs {
			t.Errorf("%s: %s %s -> %d %s %s: not as docs/openapi.yaml says: %v", x.name, x.method, x.path, a.status, a.header.Get("Content-Type"), a.body, e)
		}
		if len(errs) == 0 {
			t.Errorf("%s: %s %s -> %d: not as docs/openapi.yaml says", x.name, x.method, x.path, a.status)
		}
	}
	h.mu.Lock()
	h.checked[fmt.Sprintf("%s %s %d", x.method, x.path, a.status)] = true
	h.mu.Unlock()
}

func (h *harness) payments(t *testing.T) {
	key := map[string]string{"Idempotency-Key": "pay-1"}
	first := h.do(t, exchange{name: "create a payment", method: "POST", path: "/payments", token: tenantToken, header: key, body: article, conforms: true, status: 201})
	var p struct{ PaymentID string }
	first.json(t, &p)
	again := h.do(t, exchange{name: "replay", method: "POST", path: "/payments", token: tenantToken, header: key, body: article, conforms: true, status: 201})
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: Idempotent-Replayed %q", again.header.Get("Idempotent-Replayed"))
	}
	h.do(t, exchange{name: "reused key", method: "POST", path: "/payments", token: tenantToken, header: key, conforms: true,
		body: strings.Replace(article, "10.00", "11.00", 1), status: 409, code: idem.ECodeKeyReused})
	h.do(t, exchange{name: "get a payment", method: "GET", path: "/payments/" + p.PaymentID, token: tenantToken, conforms: true, status: 200})
	h.do(t, exchange{name: "unknown payment", method: "GET", path: "/payments/pay_none", token: tenantToken, conforms: true, status: 404, code: payments.ECodePaymentNotFound})
	h.do(t, exchange{name: "unknown token", method: "POST", path: "/payments", token: "nope", header: key, body: article, conforms: true, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "duplicate merchant reference", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-dup"},
		body: article, conforms: true, status: 409, code: payments.ECodeDuplicateMerchantRef})

	// The provider declines, loses its answer, or takes its time.
	other := func(ref string) string { return strings.Replace(article, "invoice-7781", ref, 1) }
	h.fault(t, provider.Fault{Mode: provider.FaultDecline, Times: 1})
	h.do(t, exchange{name: "declined", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-declined"},
		body: other("inv-declined"), conforms: true, status: 402, code: payments.ECodePaymentDeclined})
	h.fault(t, provider.Fault{Mode: provider.FaultLoseAnswer, Times: 1})
	h.do(t, exchange{name: "provider answer lost", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-lost"},
		body: other("inv-lost"), conforms: true, status: 202, code: payments.ECodeOutcomeUnknown})
	h.fault(t, provider.Fault{Mode: provider.FaultSlow, Times: 1, Delay: 1500 * time.Millisecond})
	slow := exchange{name: "slow charge", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-slow"},
		body: other("inv-slow"), conforms: true, status: 201}
	done := make(chan struct{})
	go func(x exchange) {
		defer close(done)
		h.do(t, x)
	}(slow)
	time.Sleep(500 * time.Millisecond)
	busy := slow
	busy.name, busy.header, busy.status, busy.code = "in progress", map[string]string{"Idempotency-Key": "pay-slow", "Prefer": "wait=0"}, 409, idem.ECodeInProgress
	if a := h.do(t, busy); a.header.Get("Retry-After") == "" {
		t.Error("in progress: no Retry-After")
	}
	<-done

	// Mistakes the document refuses.
	h.do(t, exchange{name: "no token", method: "POST", path: "/payments", header: key, body: article, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "no key", method: "POST", path: "/payments", token: tenantToken, body: article, status: 400, code: idem.ECodeKeyMissing})
	h.do(t, exchange{name: "bad key", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "a b"}, body: article, status: 400, code: idem.ECodeKeyInvalid})
	h.do(t, exchange{name: "malformed JSON", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-2"}, body: `{"accountId":`, status: 422, code: idem.ECodeRequestMalformed})
	h.do(t, exchange{name: "missing member", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-3"},
		body: `{"accountId":"acc_1","currency":"EUR","merchantReference":"r"}`, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "oversized body", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-4"},
		body: strings.Replace(article, "invoice-7781", strings.Repeat("x", 70<<10), 1), status: 413, code: idem.ECodeBodyTooLarge})
	h.do(t, exchange{name: "not JSON", method: "POST", path: "/payments", token: tenantToken, header: map[string]string{"Idempotency-Key": "pay-5", "Content-Type": "text/plain"},
		body: "amount=10", status: 415, code: idem.ECodeUnsupportedMediaType})
}

// fault sets the provider's next fault.
func (h *harness) fault(t *testing.T, f provider.Fault) {
	t.Helper()
	if err := h.provider.SetFault(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) records(t *testing.T) {
	h.do(t, exchange{name: "inspect a record", method: "GET", path: "/v1/idempotency/records/create_payment/pay-1", token: tenantToken, conforms: true, status: 200})
	h.do(t, exchange{name: "inspect no record", method: "GET", path: "/v1/idempotency/records/create_payment/pay-none", token: tenantToken, conforms: true, status: 404, code: idem.ECodeRecordNotFound})
	h.do(t, exchange{name: "inspect with a bad key", method: "GET", path: "/v1/idempotency/records/create_payment/a%20b", token: tenantToken, status: 400, code: idem.ECodeKeyInvalid})
	h.do(t, exchange{name: "inspect with a bad operation", method: "GET", path: "/v1/idempotency/records/Create/pay-1", token: tenantToken, status: 422, code: idem.ECodeValidationFailed})
}

func (h *harness) coordination(t *testing.T) {
	base := "/v1/coordination/" + operation + "/"
	command := `{"command":{"accountId":"acc_1","amountMinor":1000}}`
	first := h.do(t, exchange{name: "begin", method: "POST", path: base + "c-1/begin", token: tenantToken, body: command, conforms: true, status: 200})
	var begun struct {
		Outcome      string
		FencingToken int64
	}
	first.json(t, &begun)
	if begun.Outcome != "execute" || begun.FencingToken < 1 {
		t.Fatalf("begin: %s, want execute with a token", first.body)
	}
	token := fmt.Sprint(begun.FencingToken)
	if a := h.do(t, exchange{name: "begin in progress", method: "POST", path: base + "c-1/begin", token: tenantToken, body: command, conforms: true, status: 200}); !bytes.Contains(a.body, []byte(`"in_progress"`)) {
		t.Errorf("begin again: %s, want in_progress", a.body)
	}
	if a := h.do(t, exchange{name: "begin conflict", method: "POST", path: base + "c-1/begin", token: tenantToken, body: `{"command":{"accountId":"acc_2"}}`, conforms: true, status: 200}); !bytes.Contains(a.body, []byte(`"conflict"`)) {
		t.Errorf("begin with another command: %s, want conflict", a.body)
	}
	h.do(t, exchange{name: "checkpoint", method: "POST", path: base + "c-1/checkpoint", token: tenantToken, body: `{"fencingToken":` + token + `,"checkpoint":"PROVIDER_REQUEST_SENT"}`, conforms: true, status: 204})
	h.do(t, exchange{name: "complete", method: "POST", path: base + "c-1/complete", token: tenantToken, conforms: true, status: 204,
		body: `{"fencingToken":` + token + `,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"eyJpZCI6ImNoXzEifQ==","schemaVersion":"v2"},"resourceType":"charge","resourceId":"ch_1"}`})
	if a := h.do(t, exchange{name: "begin replay", method: "POST", path: base + "c-1/begin", token: tenantToken, body: command, conforms: true, status: 200}); !bytes.Contains(a.body, []byte(`"replay"`)) {
		t.Errorf("begin after complete: %s, want replay", a.body)
	}
	h.do(t, exchange{name: "get a record", method: "GET", path: base + "c-1", token: tenantToken, conforms: true, status: 200})
	h.do(t, exchange{name: "get no record", method: "GET", path: base + "c-none", token: tenantToken, conforms: true, status: 404, code: idem.ECodeRecordNotFound})
	h.do(t, exchange{name: "checkpoint a settled record", method: "POST", path: base + "c-1/checkpoint", token: tenantToken, body: `{"fencingToken":` + token + `,"checkpoint":"X"}`, conforms: true, status: 409, code: idem.ECodeFencingTokenStale})

	// A failure of unknown outcome, left for the admin API to settle.
	second := h.do(t, exchange{name: "begin another", method: "POST", path: base + "c-2/begin", token: tenantToken, body: command, conforms: true, status: 200})
	second.json(t, &begun)
	h.do(t, exchange{name: "fail unknown", method: "POST", path: base + "c-2/fail", token: tenantToken, conforms: true, status: 204,
		body: fmt.Sprintf(`{"fencingToken":%d,"status":"UNKNOWN_REQUIRES_RECOVERY","errorCode":"PROVIDER_TIMEOUT"}`, begun.FencingToken)})

	// A begin sent again with its claim id after a lost answer: the
	// record it claimed, with its token.
	withClaim := `{"command":{"accountId":"acc_1"},"claimId":"claim-0123456789abcdef"}`
	h.do(t, exchange{name: "begin with a claim id", method: "POST", path: base + "c-4/begin", token: tenantToken, body: withClaim, conforms: true, status: 200})
	if a := h.do(t, exchange{name: "begin again with its claim id", method: "POST", path: base + "c-4/begin", token: tenantToken, body: withClaim, conforms: true, status: 200}); !bytes.Contains(a.body, []byte(`"execute"`)) {
		t.Errorf("begin again with its claim id: %s, want execute", a.body)
	}
	h.do(t, exchange{name: "short claim id", method: "POST", path: base + "c-4/begin", token: tenantToken, body: `{"command":{},"claimId":"short"}`, status: 422, code: idem.ECodeValidationFailed})

	// An operation the node does not serve: 404 on every route.
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/coordination/refund/c-1/begin", command},
		{"POST", "/v1/coordination/refund/c-1/checkpoint", `{"fencingToken":1,"checkpoint":"X"}`},
		{"POST", "/v1/coordination/refund/c-1/complete", `{"fencingToken":1,"response":{"status":200}}`},
		{"POST", "/v1/coordination/refund/c-1/fail", `{"fencingToken":1,"status":"FAILED_RETRYABLE"}`},
		{"GET", "/v1/coordination/refund/c-1", ""},
	} {
		h.do(t, exchange{name: "unknown operation", method: r.method, path: r.path, token: tenantToken, body: r.body, conforms: true, status: 404, code: idem.ECodeOperationUnknown})
	}
	h.do(t, exchange{name: "unknown token", method: "POST", path: base + "c-3/begin", token: "nope", body: command, conforms: true, status: 401, code: idem.ECodeUnauthenticated})

	// Mistakes the document refuses.
	h.do(t, exchange{name: "no token", method: "POST", path: base + "c-3/begin", body: command, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "bad key", method: "POST", path: base + "a%20b/begin", token: tenantToken, body: command, status: 400, code: idem.ECodeKeyInvalid})
	h.do(t, exchange{name: "malformed JSON", method: "POST", path: base + "c-3/begin", token: tenantToken, body: `{"command":`, status: 422, code: idem.ECodeRequestMalformed})
	h.do(t, exchange{name: "both hash and command", method: "POST", path: base + "c-3/begin", token: tenantToken, body: `{"command":{},"requestHash":"v1:x"}`, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "unknown member", method: "POST", path: base + "c-3/begin", token: tenantToken, body: `{"command":{},"owner":"o","color":"red"}`, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "token below 1", method: "POST", path: base + "c-1/checkpoint", token: tenantToken, body: `{"fencingToken":0,"checkpoint":"X"}`, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "oversized body", method: "POST", path: base + "c-3/begin", token: tenantToken, conforms: true,
		body: `{"command":{"x":"` + strings.Repeat("x", 70<<10) + `"}}`, status: 413, code: idem.ECodeBodyTooLarge})
	h.do(t, exchange{name: "not JSON", method: "POST", path: base + "c-3/begin", token: tenantToken, header: map[string]string{"Content-Type": "text/plain"},
		body: "x", status: 415, code: idem.ECodeUnsupportedMediaType})
}

func (h *harness) admin(t *testing.T) {
	const base = "/v1/admin/records"
	h.do(t, exchange{name: "list", method: "GET", path: base + "?limit=10", token: adminToken, conforms: true, status: 200})
	list := h.do(t, exchange{name: "list stuck", method: "GET", path: base + "?tenant=tenant-a&operation=" + operation + "&status=UNKNOWN_REQUIRES_RECOVERY&olderThan=0s&limit=1", token: adminToken, conforms: true, status: 200})
	var page struct{ Records []struct{ Key string } }
	list.json(t, &page)
	if len(page.Records) != 1 || page.Records[0].Key != "c-2" {
		t.Errorf("stuck records: %s, want c-2", list.body)
	}
	h.do(t, exchange{name: "list with an unknown filter", method: "GET", path: base + "?colour=red", token: adminToken, conforms: true, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "list with a tenant's token", method: "GET", path: base, token: tenantToken, conforms: true, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "list without a token", method: "GET", path: base, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "list with a bad limit", method: "GET", path: base + "?limit=0", token: adminToken, status: 422, code: idem.ECodeValidationFailed})

	rec := base + "/tenant-a/" + operation + "/"
	h.do(t, exchange{name: "show", method: "GET", path: rec + "c-2", token: adminToken, conforms: true, status: 200})
	h.do(t, exchange{name: "show none", method: "GET", path: rec + "c-none", token: adminToken, conforms: true, status: 404, code: idem.ECodeRecordNotFound})
	h.do(t, exchange{name: "show a bad key", method: "GET", path: rec + "a%20b", token: adminToken, status: 400, code: idem.ECodeKeyInvalid})
	settle := `{"as":"FAILED_RETRYABLE","reason":"the provider has no charge for it"}`
	h.do(t, exchange{name: "settle", method: "POST", path: rec + "c-2/settle", token: adminToken, body: settle, conforms: true, status: 200})
	h.do(t, exchange{name: "settle not stuck", method: "POST", path: rec + "c-1/settle", token: adminToken, body: settle, conforms: true, status: 409, code: idem.ECodeRecordNotStuck})
	h.do(t, exchange{name: "settle none", method: "POST", path: rec + "c-none/settle", token: adminToken, body: settle, conforms: true, status: 404, code: idem.ECodeRecordNotFound})
	h.do(t, exchange{name: "settle without a reason", method: "POST", path: rec + "c-1/settle", token: adminToken, body: `{"as":"FAILED_RETRYABLE"}`, status: 422, code: idem.ECodeValidationFailed})
	h.do(t, exchange{name: "settle malformed", method: "POST", path: rec + "c-1/settle", token: adminToken, body: `{"as":`, status: 422, code: idem.ECodeRequestMalformed})
}

func (h *harness) sidecar(t *testing.T) {
	key := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }
	h.do(t, exchange{name: "proxied", method: "POST", path: "/transfers", token: tenantToken, header: key("t-1"), body: `{"amount":1}`, conforms: true, status: 201})
	if a := h.do(t, exchange{name: "proxied replay", method: "POST", path: "/transfers", token: tenantToken, header: key("t-1"), body: `{"amount":1}`, conforms: true, status: 201}); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("proxied replay: Idempotent-Replayed %q", a.header.Get("Idempotent-Replayed"))
	}
	h.do(t, exchange{name: "proxied under the prefix", method: "POST", path: "/transfers/tr_1/reverse", token: tenantToken, header: key("t-2"), body: `{}`, conforms: true, status: 201})
	h.do(t, exchange{name: "proxied reused key", method: "POST", path: "/transfers", token: tenantToken, header: key("t-1"), body: `{"amount":2}`, conforms: true, status: 409, code: idem.ECodeKeyReused})

	// In progress: the first call is held by the upstream.
	slow := exchange{name: "proxied slow", method: "POST", path: "/transfers", token: tenantToken, header: key("t-3"), body: `{"delayMs":1500}`, conforms: true, status: 201}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.do(t, slow)
	}()
	time.Sleep(300 * time.Millisecond)
	a := h.do(t, exchange{name: "proxied in progress", method: "POST", path: "/transfers", token: tenantToken, header: map[string]string{"Idempotency-Key": "t-3", "Prefer": "wait=0"},
		body: `{"delayMs":1500}`, conforms: true, status: 409, code: idem.ECodeInProgress})
	if a.header.Get("Retry-After") == "" {
		t.Errorf("proxied in progress: no Retry-After")
	}
	<-done

	h.do(t, exchange{name: "proxied unknown outcome", method: "POST", path: "/transfers", token: tenantToken, header: key("t-4"), body: `{"hangUp":true}`, conforms: true, status: 202, code: idem.ECodeOutcomeUnknown})
	h.do(t, exchange{name: "proxied unreachable", method: "POST", path: "/dead", token: tenantToken, header: key("d-1"), body: `{}`, conforms: true, status: 503, code: idem.ECodeUnavailable})
	h.do(t, exchange{name: "proxied without a key", method: "POST", path: "/transfers", token: tenantToken, body: `{}`, conforms: true, status: 400, code: idem.ECodeKeyMissing})
	h.do(t, exchange{name: "proxied bad key", method: "POST", path: "/transfers", token: tenantToken, header: key("a b"), body: `{}`, conforms: true, status: 400, code: idem.ECodeKeyInvalid})
	h.do(t, exchange{name: "proxied malformed JSON", method: "POST", path: "/transfers", token: tenantToken, header: key("t-5"), body: `{"amount":`, conforms: true, status: 422, code: idem.ECodeRequestMalformed})
	h.do(t, exchange{name: "proxied oversized body", method: "POST", path: "/transfers", token: tenantToken, header: key("t-6"), body: `{"x":"` + strings.Repeat("x", 70<<10) + `"}`, conforms: true, status: 413, code: idem.ECodeBodyTooLarge})
	h.do(t, exchange{name: "proxied unknown token", method: "POST", path: "/transfers", token: "nope", header: key("t-7"), body: `{}`, conforms: true, status: 401, code: idem.ECodeUnauthenticated})
	h.do(t, exchange{name: "proxied path outside the route", method: "POST", path: "/transfers/%2e%2e/admin", token: tenantToken, header: key("t-8"), body: `{}`, conforms: true, status: 400, code: idem.ECodePathInvalid, heldAs: "/transfers"})
}

func (h *harness) operations(t *testing.T) {
	h.do(t, exchange{name: "healthz", method: "GET", path: "/healthz", conforms: true, status: 200})
	h.do(t, exchange{name: "readyz", method: "GET", path: "/readyz", conforms: true, status: 200})
	h.do(t, exchange{name: "metrics", method: "GET", path: "/metrics", conforms: true, status: 200})
}

// TestValidatorCatchesDrift: the validator the test relies on refuses
// answers the document does not describe (a problem without its members,
// an undocumented status, a body of the wrong type), so a node that
// drifted from docs/openapi.yaml fails the test above.
func TestValidatorCatchesDrift(t *testing.T) {
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	problem := http.Header{"Content-Type": {"application/problem+json"}}
	for _, tc := range []struct {
		name, method, path string
		status             int
		header             http.Header
		body               string
	}{
		{"a problem without its members", "GET", "/v1/coordination/charge/k", 404, problem, `{"errorCode":"OPERATION_UNKNOWN","message":"x"}`},
		{"an unknown errorCode", "GET", "/v1/coordination/charge/k", 404, problem,
			`{"type":"https://x/y","title":"t","status":404,"detail":"d","errorCode":"NO_SUCH_CODE","message":"d"}`},
		{"a problem with a member of its own", "GET", "/v1/coordination/charge/k", 404, problem,
			`{"type":"https://x/y","title":"t","status":404,"detail":"d","errorCode":"OPERATION_UNKNOWN","message":"d","tenant":"tenant-a"}`},
		{"a payment's problem with a member of its own", "GET", "/payments/p", 404, problem,
			`{"type":"https://x/y","title":"t","status":404,"detail":"d","errorCode":"PAYMENT_NOT_FOUND","message":"d","paymentId":"p"}`},
		{"an undocumented status", "GET", "/healthz", 418, http.Header{"Content-Type": {"application/json"}}, `{}`},
		{"a health answer without its region", "GET", "/healthz", 200, http.Header{"Content-Type": {"application/json"}}, `{"status":"ok"}`},
		{"a record as text", "GET", "/v1/coordination/charge/k", 200, http.Header{"Content-Type": {"text/plain"}}, "record"},
	} {
		req, err := http.NewRequest(tc.method, "http://127.0.0.1:8080"+tc.path, http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		resp := &http.Response{StatusCode: tc.status, Header: tc.header, Body: io.NopCloser(strings.NewReader(tc.body)), Request: req}
		if ok, _ := v.ValidateHttpRequestResponse(req, resp); ok {
			t.Errorf("%s: the validator accepts %d %s for %s %s", tc.name, tc.status, tc.body, tc.method, tc.path)
		}
	}
}

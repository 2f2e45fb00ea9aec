package simulator

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemcoord/idem/provider"
)

// TestBodiesAreStrict: encoding/json matched names in any case and kept the
// last of duplicates, so {"amountMinor":1,"AMOUNTMINOR":999} charged 999.
func TestBodiesAreStrict(t *testing.T) {
	e := newEnv(t, "")
	post := func(method, path, body string, hdr map[string]string) (int, string) {
		t.Helper()
		rq, _ := http.NewRequestWithContext(ctxT(t), method, e.ts.URL+path, strings.NewReader(body))
		for k, v := range hdr {
			rq.Header.Set(k, v)
		}
		resp, err := e.ts.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var eb struct{ ErrorCode string }
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return resp.StatusCode, eb.ErrorCode
	}
	key := map[string]string{provider.HeaderIdempotencyKey: "provider_payment_strict"}
	for _, body := range []string{
		`{"amountMinor":1,"AMOUNTMINOR":999,"currency":"EUR"}`,
		`{"AmountMinor":999,"currency":"EUR"}`,
		`{"amountMinor":1,"amountMinor":999,"currency":"EUR"}`,
		"{\"amountMinor\":1,\"currency\":\"EUR\",\"accountId\":\"\xff\"}",
		`{"amountMinor":1,"currency":"EUR"} {}`,
		`{"amountMinor":1,"currency":"EUR","x":1}`,
	} {
		if status, code := post(http.MethodPost, "/v1/charges", body, key); status != 400 || code != provider.CodeInvalidRequest {
			t.Errorf("charge %s = %d %s, want 400 %s", body, status, code, provider.CodeInvalidRequest)
		}
	}
	e.wantCounts(t, 0, map[string]int{})
	for _, body := range []string{
		`{"mode":"none","mode":"fail"}`,
		`{"MODE":"fail"}`,
		`{"mode":"fail","times":1,"Times":0}`,
	} {
		if status, code := post(http.MethodPut, "/admin/fault", body, nil); status != 400 || code != provider.CodeInvalidFault {
			t.Errorf("fault %s = %d %s, want 400 %s", body, status, code, provider.CodeInvalidFault)
		}
	}
	if f := e.srv.Fault(); f.Mode != provider.FaultNone {
		t.Errorf("fault = %+v after rejected bodies, want none", f)
	}
}

// FuzzChargeRequest feeds bodies to the charge handler: it never panics,
// answers 201 or 400 (with INVALID_REQUEST), and a 400 charges nothing.
func FuzzChargeRequest(f *testing.F) {
	for _, s := range []string{
		`{"amountMinor":100,"currency":"EUR","accountId":"acc_1"}`, `{"amountMinor":1,"AMOUNTMINOR":999,"currency":"EUR"}`,
		`{"amountMinor":1,"amountMinor":2,"currency":"EUR"}`, `{`, `[]`, `{"amountMinor":1e3,"currency":"EUR"}`,
		`{"amountMinor":9223372036854775808,"currency":"EUR"}`,
	} {
		f.Add([]byte(s))
	}
	srv, err := NewServer(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })
	h := srv.Handler()
	n := 0
	f.Fuzz(func(t *testing.T, body []byte) {
		n++
		before := srv.store.counts().Total
		rq := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(string(body)))
		rq.Header.Set(provider.HeaderIdempotencyKey, "provider_payment_fuzz"+strings.Repeat("x", n%7)+string(rune('a'+n%26)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, rq)
		after := srv.store.counts().Total
		switch rec.Code {
		case http.StatusCreated, http.StatusOK, http.StatusConflict:
			var b provider.ChargeBody
			if err := json.Unmarshal(body, &b); err != nil || b.AmountMinor <= 0 {
				t.Fatalf("accepted %q (%d)", body, rec.Code)
			}
		case http.StatusBadRequest:
			var eb provider.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.ErrorCode != provider.CodeInvalidRequest {
				t.Fatalf("400 without INVALID_REQUEST: %s", rec.Body)
			}
			if after != before {
				t.Fatalf("rejected body %q charged", body)
			}
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}

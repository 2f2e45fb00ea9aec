package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemcoord/idem/provider"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is a simulator behind a real HTTP server, with a client for it.
type env struct {
	srv    *Server
	ts     *httptest.Server
	client *provider.Client
}

// newEnv starts a simulator over dir ("" = in memory). Cleanup closes the
// HTTP server (and the client's idle connections), then the Server.
func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	srv, err := NewServer(Config{DataDir: dir})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Server.Close: %v", err)
		}
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &env{srv: srv, ts: ts, client: &provider.Client{BaseURL: ts.URL, HTTP: ts.Client()}}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func req(paymentID string) provider.ChargeRequest {
	return provider.ChargeRequest{ProviderKey: provider.ProviderKeyFor(paymentID), AmountMinor: 1000, Currency: "EUR", AccountID: "acc_1"}
}

func (e *env) setFault(t *testing.T, f provider.Fault) {
	t.Helper()
	if err := e.client.SetFault(ctxT(t), f); err != nil {
		t.Fatalf("SetFault(%+v): %v", f, err)
	}
}

// wantCounts checks the applied-charge counters.
func (e *env) wantCounts(t *testing.T, total int, byKey map[string]int) {
	t.Helper()
	got, err := e.client.Charges(ctxT(t))
	if err != nil {
		t.Fatalf("Charges: %v", err)
	}
	if got.Total != total {
		t.Errorf("Charges().Total = %d, want %d (byKey %v)", got.Total, total, got.ByKey)
	}
	if byKey == nil {
		byKey = map[string]int{}
	}
	if len(got.ByKey) != len(byKey) {
		t.Errorf("Charges().ByKey = %v, want %v", got.ByKey, byKey)
	}
	for k, n := range byKey {
		if got.ByKey[k] != n {
			t.Errorf("Charges().ByKey[%q] = %d, want %d", k, got.ByKey[k], n)
		}
	}
}

func mustCharge(t *testing.T, c *provider.Client, r provider.ChargeRequest) provider.Charge {
	t.Helper()
	ch, err := c.Charge(ctxT(t), r)
	if err != nil {
		t.Fatalf("Charge(%s): %v", r.ProviderKey, err)
	}
	return ch
}

func TestRepeatedKeyChargesOnce(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_1")

	first := mustCharge(t, e.client, r)
	if first.Replayed {
		t.Error("first charge: Replayed = true, want false")
	}
	want := provider.Charge{
		ChargeID: ChargeIDFor(r.ProviderKey), ProviderKey: r.ProviderKey, Status: provider.StatusConfirmed,
		AmountMinor: 1000, Currency: "EUR", AccountID: "acc_1", CreatedAt: first.CreatedAt,
	}
	if first != want {
		t.Errorf("first charge = %+v, want %+v", first, want)
	}
	if !strings.HasPrefix(first.ChargeID, "ch_") || len(first.ChargeID) != 3+16 {
		t.Errorf("ChargeID = %q, want ch_ + 16 hex digits", first.ChargeID)
	}

	for i := range 3 {
		again := mustCharge(t, e.client, r)
		if !again.Replayed {
			t.Errorf("repeat %d: Replayed = false, want true", i)
		}
		again.Replayed = false
		if again != first {
			t.Errorf("repeat %d = %+v, want %+v", i, again, first)
		}
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})

	got, err := e.client.Lookup(ctxT(t), r.ProviderKey)
	if err != nil || got != first {
		t.Errorf("Lookup = %+v, %v; want %+v", got, err, first)
	}
}

func TestRawHTTPContract(t *testing.T) {
	e := newEnv(t, "")
	post := func(key, token, body string) (*http.Response, []byte) {
		t.Helper()
		rq, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, e.ts.URL+"/v1/charges", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			rq.Header.Set("Idempotency-Key", key)
		}
		if token != "" {
			rq.Header.Set("Idem-Fencing-Token", token)
		}
		resp, err := e.ts.Client().Do(rq)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	const body = `{"amountMinor":1000,"currency":"EUR","accountId":"acc_1"}`
	tests := []struct {
		name, key, token, body string
		wantStatus             int
		wantCode               string
		wantReplayed           bool
	}{
		{name: "missing key", body: body, wantStatus: 400, wantCode: provider.CodeKeyMissing},
		{name: "malformed key", key: "pay_1", body: body, wantStatus: 400, wantCode: provider.CodeKeyInvalid},
		{name: "bad token", key: "provider_payment_p1", token: "x", body: body, wantStatus: 400, wantCode: provider.CodeFencingTokenInvalid},
		{name: "bad json", key: "provider_payment_p1", body: `{`, wantStatus: 400, wantCode: provider.CodeInvalidRequest},
		{name: "zero amount", key: "provider_payment_p1", body: `{"amountMinor":0,"currency":"EUR"}`, wantStatus: 400, wantCode: provider.CodeInvalidRequest},
		{name: "bad currency", key: "provider_payment_p1", body: `{"amountMinor":1,"currency":"eur"}`, wantStatus: 400, wantCode: provider.CodeInvalidRequest},
		{name: "first", key: "provider_payment_p1", body: body, wantStatus: 201},
		{name: "repeat", key: "provider_payment_p1", body: body, wantStatus: 200, wantReplayed: true},
		{name: "reused", key: "provider_payment_p1", body: `{"amountMinor":999,"currency":"EUR"}`, wantStatus: 409, wantCode: provider.CodeKeyReused},
	}
	var firstBody []byte
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(tc.key, tc.token, tc.body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, tc.wantStatus, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if got := resp.Header.Get("Idempotent-Replayed") == "true"; got != tc.wantReplayed {
				t.Errorf("Idempotent-Replayed = %v, want %v", got, tc.wantReplayed)
			}
			if tc.wantCode != "" {
				var eb struct{ ErrorCode, Message string }
				if err := json.Unmarshal(b, &eb); err != nil || eb.ErrorCode != tc.wantCode || eb.Message == "" {
					t.Errorf("body = %s (%v), want errorCode %s and a message", b, err, tc.wantCode)
				}
				return
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("body %s: %v", b, err)
			}
			for _, f := range []string{"chargeId", "providerKey", "status", "amountMinor", "currency"} {
				if _, ok := m[f]; !ok {
					t.Errorf("body %s lacks %q", b, f)
				}
			}
			if tc.wantStatus == 201 {
				firstBody = b
			} else if !bytes.Equal(b, firstBody) {
				t.Errorf("replay body %s differs from first %s", b, firstBody)
			}
		})
	}

	for _, path := range []string{"/healthz", "/v1/charges/provider_payment_p1", "/admin/charges", "/admin/fault"} {
		resp, err := e.ts.Client().Get(e.ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d, want 200", path, resp.StatusCode)
		}
	}
	resp, err := e.ts.Client().Get(e.ts.URL + "/v1/charges/provider_payment_never")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), provider.CodeChargeNotFound) {
		t.Errorf("GET unknown charge = %d %s, want 404 %s", resp.StatusCode, b, provider.CodeChargeNotFound)
	}
	e.wantCounts(t, 1, map[string]int{"provider_payment_p1": 1})
}

func TestKeyReused(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_reuse")
	mustCharge(t, e.client, r)
	tests := []struct {
		name   string
		mutate func(*provider.ChargeRequest)
	}{
		{"different amount", func(r *provider.ChargeRequest) { r.AmountMinor = 2000 }},
		{"different currency", func(r *provider.ChargeRequest) { r.Currency = "USD" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r2 := r
			tc.mutate(&r2)
			_, err := e.client.Charge(ctxT(t), r2)
			if !errors.Is(err, provider.ErrKeyReused) {
				t.Fatalf("Charge = %v, want ErrKeyReused", err)
			}
			var apiErr *provider.APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 409 || apiErr.Code != provider.CodeKeyReused {
				t.Errorf("error = %#v, want *APIError 409 %s", err, provider.CodeKeyReused)
			}
		})
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
}

func TestFaultFail(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_fail")
	e.setFault(t, provider.Fault{Mode: provider.FaultFail, Times: 1})

	_, err := e.client.Charge(ctxT(t), r)
	if !errors.Is(err, provider.ErrUnavailable) || errors.Is(err, provider.ErrAmbiguous) {
		t.Fatalf("Charge during fail = %v, want ErrUnavailable and not ErrAmbiguous", err)
	}
	e.wantCounts(t, 0, nil)
	if _, err := e.client.Lookup(ctxT(t), r.ProviderKey); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Lookup after fail = %v, want ErrNotFound", err)
	}

	ch := mustCharge(t, e.client, r)
	if ch.Replayed {
		t.Error("charge after fail: Replayed = true, want a first charge")
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
}

func TestFaultDecline(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_decl")
	e.setFault(t, provider.Fault{Mode: provider.FaultDecline, Times: 1})

	_, err := e.client.Charge(ctxT(t), r)
	if !errors.Is(err, provider.ErrDeclined) {
		t.Fatalf("Charge during decline = %v, want ErrDeclined", err)
	}
	if f, err := e.client.Fault(ctxT(t)); err != nil || f.Mode != provider.FaultNone {
		t.Fatalf("Fault after one decline = %+v, %v; want none", f, err)
	}

	// The decline is remembered for the key, with no fault active.
	_, err = e.client.Charge(ctxT(t), r)
	var apiErr *provider.APIError
	if !errors.Is(err, provider.ErrDeclined) || !errors.As(err, &apiErr) || !apiErr.Replayed || apiErr.StatusCode != 402 || apiErr.Code != provider.CodeDeclined {
		t.Fatalf("repeat of declined key = %#v, want replayed 402 %s", err, provider.CodeDeclined)
	}
	if _, err := e.client.Lookup(ctxT(t), r.ProviderKey); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Lookup of declined key = %v, want ErrNotFound", err)
	}
	e.wantCounts(t, 0, nil)

	other := mustCharge(t, e.client, req("pay_other"))
	if other.Replayed {
		t.Error("other key replayed")
	}
	e.wantCounts(t, 1, map[string]int{other.ProviderKey: 1})
}

func TestFaultDeclineDoesNotUndoCharge(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_charged")
	first := mustCharge(t, e.client, r)
	e.setFault(t, provider.Fault{Mode: provider.FaultDecline, Times: 1})
	again := mustCharge(t, e.client, r)
	if !again.Replayed || again.ChargeID != first.ChargeID {
		t.Errorf("charged key during decline = %+v, want replay of %s", again, first.ChargeID)
	}
}

func TestFaultLoseAnswer(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_lost")
	// The SetFault call leaves a keep-alive connection that the charge
	// reuses: the client must not let net/http re-send the charge.
	e.setFault(t, provider.Fault{Mode: provider.FaultLoseAnswer, Times: 1})

	_, err := e.client.Charge(ctxT(t), r)
	if !errors.Is(err, provider.ErrAmbiguous) || errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("Charge during lose-answer = %v, want ErrAmbiguous and not ErrUnavailable", err)
	}
	var urlErr *url.Error
	if !errors.As(err, &urlErr) {
		t.Errorf("error %v does not wrap the transport error", err)
	}

	got, err := e.client.Lookup(ctxT(t), r.ProviderKey)
	if err != nil {
		t.Fatalf("Lookup after lost answer: %v", err)
	}
	if got.ChargeID != ChargeIDFor(r.ProviderKey) || got.AmountMinor != r.AmountMinor {
		t.Errorf("Lookup = %+v", got)
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})

	retry := mustCharge(t, e.client, r)
	if !retry.Replayed || retry.ChargeID != got.ChargeID {
		t.Errorf("retry = %+v, want replay of %s", retry, got.ChargeID)
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
}

func TestFaultSlowClientTimeout(t *testing.T) {
	e := newEnv(t, "")
	const delay = 400 * time.Millisecond
	e.setFault(t, provider.Fault{Mode: provider.FaultSlow, Times: 1, Delay: delay})
	r := req("pay_slow")

	impatient := &provider.Client{BaseURL: e.ts.URL, HTTP: &http.Client{Transport: e.ts.Client().Transport, Timeout: 50 * time.Millisecond}}
	start := time.Now()
	_, err := impatient.Charge(ctxT(t), r)
	if !errors.Is(err, provider.ErrAmbiguous) || errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("Charge with short timeout = %v, want ErrAmbiguous", err)
	}
	if time.Since(start) < delay/2 {
		if _, err := e.client.Lookup(ctxT(t), r.ProviderKey); !errors.Is(err, provider.ErrNotFound) {
			t.Errorf("Lookup before the delay ended = %v, want ErrNotFound", err)
		}
	}

	deadline := time.Now().Add(5 * time.Second)
	for {
		ch, err := e.client.Lookup(ctxT(t), r.ProviderKey)
		if err == nil {
			if elapsed := time.Since(start); elapsed < delay-20*time.Millisecond {
				t.Errorf("charge appeared after %s, before the %s delay", elapsed, delay)
			}
			if ch.ChargeID != ChargeIDFor(r.ProviderKey) {
				t.Errorf("Lookup = %+v", ch)
			}
			break
		}
		if !errors.Is(err, provider.ErrNotFound) {
			t.Fatalf("Lookup: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("charge never appeared after the slow delay")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
}

func TestFaultSlowPatientClient(t *testing.T) {
	e := newEnv(t, "")
	const delay = 150 * time.Millisecond
	e.setFault(t, provider.Fault{Mode: provider.FaultSlow, Times: 1, Delay: delay})
	start := time.Now()
	ch := mustCharge(t, e.client, req("pay_patient"))
	if elapsed := time.Since(start); elapsed < delay {
		t.Errorf("slow charge answered after %s, want >= %s", elapsed, delay)
	}
	if ch.Replayed {
		t.Error("Replayed = true")
	}
}

func TestFaultTimes(t *testing.T) {
	tests := []struct {
		name       string
		times      int
		wantFailed int // of 4 calls before the fault is cleared
	}{
		{"times 2", 2, 2},
		{"times 1", 1, 1},
		{"times 0 until changed", 0, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "")
			e.setFault(t, provider.Fault{Mode: provider.FaultFail, Times: tc.times})
			f, err := e.client.Fault(ctxT(t))
			if err != nil || f != (provider.Fault{Mode: provider.FaultFail, Times: tc.times}) {
				t.Fatalf("Fault = %+v, %v", f, err)
			}
			failed := 0
			charged := map[string]int{}
			for i := range 4 {
				r := req(fmt.Sprintf("pay_times_%d", i))
				_, err := e.client.Charge(ctxT(t), r)
				switch {
				case errors.Is(err, provider.ErrUnavailable):
					failed++
					if i >= tc.wantFailed {
						t.Errorf("call %d failed after the fault should be over", i)
					}
				case err != nil:
					t.Fatalf("call %d: %v", i, err)
				default:
					charged[r.ProviderKey] = 1
				}
			}
			if failed != tc.wantFailed {
				t.Errorf("failed %d calls, want %d", failed, tc.wantFailed)
			}
			f, err = e.client.Fault(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			wantMode := provider.FaultNone
			if tc.times == 0 {
				wantMode = provider.FaultFail
			}
			if f.Mode != wantMode {
				t.Errorf("Fault after calls = %+v, want mode %s", f, wantMode)
			}
			e.wantCounts(t, 4-tc.wantFailed, charged)
		})
	}
}

func TestSetFaultValidation(t *testing.T) {
	e := newEnv(t, "")
	tests := []struct {
		name    string
		fault   provider.Fault
		want    provider.Fault
		wantErr bool
	}{
		{name: "slow default delay", fault: provider.Fault{Mode: provider.FaultSlow}, want: provider.Fault{Mode: provider.FaultSlow, Delay: provider.DefaultSlowDelay}},
		{name: "slow delay kept", fault: provider.Fault{Mode: provider.FaultSlow, Times: 3, Delay: 2 * time.Second}, want: provider.Fault{Mode: provider.FaultSlow, Times: 3, Delay: 2 * time.Second}},
		{name: "delay ignored when not slow", fault: provider.Fault{Mode: provider.FaultFail, Delay: time.Second}, want: provider.Fault{Mode: provider.FaultFail}},
		{name: "none", fault: provider.Fault{Mode: provider.FaultNone, Times: 5}, want: provider.Fault{Mode: provider.FaultNone}},
		{name: "unknown mode", fault: provider.Fault{Mode: "explode"}, wantErr: true},
		{name: "negative times", fault: provider.Fault{Mode: provider.FaultFail, Times: -1}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.client.SetFault(ctxT(t), tc.fault)
			if tc.wantErr {
				if !errors.Is(err, provider.ErrBadRequest) {
					t.Fatalf("SetFault = %v, want ErrBadRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.client.Fault(ctxT(t))
			if err != nil || got != tc.want {
				t.Errorf("Fault = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}

	// Raw JSON form of the admin API.
	rq, _ := http.NewRequestWithContext(ctxT(t), http.MethodPut, e.ts.URL+"/admin/fault",
		strings.NewReader(`{"mode":"slow","times":2,"delay":"2s"}`))
	resp, err := e.ts.Client().Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"delay":"2s"`) {
		t.Errorf("PUT /admin/fault = %d %s", resp.StatusCode, b)
	}
}

func TestFencing(t *testing.T) {
	e := newEnv(t, "")
	r := req("pay_fence")
	withToken := func(tok int64) provider.ChargeRequest { r2 := r; r2.FencingToken = tok; return r2 }

	first := mustCharge(t, e.client, withToken(5))
	if first.Replayed {
		t.Fatal("token 5: replayed, want first charge")
	}
	steps := []struct {
		name      string
		req       provider.ChargeRequest
		wantStale bool
	}{
		{"token 3 is stale", withToken(3), true},
		{"token 3 with other amount is still stale", func() provider.ChargeRequest { x := withToken(3); x.AmountMinor = 1; return x }(), true},
		{"token 5 equal is accepted", withToken(5), false},
		{"token 7 is accepted", withToken(7), false},
		{"token 6 is now stale", withToken(6), true},
		{"no token is not checked", r, false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			ch, err := e.client.Charge(ctxT(t), st.req)
			if st.wantStale {
				if !errors.Is(err, provider.ErrStaleToken) {
					t.Fatalf("Charge = %+v, %v; want ErrStaleToken", ch, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !ch.Replayed || ch.ChargeID != first.ChargeID {
				t.Errorf("Charge = %+v, want replay of %s", ch, first.ChargeID)
			}
		})
	}
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
}

func TestFencingStaleChargesNothing(t *testing.T) {
	// A token is remembered even when the request does not charge (here a
	// decline), so a stale writer cannot slip in afterwards.
	e := newEnv(t, "")
	r := req("pay_fence_decl")
	r.FencingToken = 9
	e.setFault(t, provider.Fault{Mode: provider.FaultDecline, Times: 1})
	if _, err := e.client.Charge(ctxT(t), r); !errors.Is(err, provider.ErrDeclined) {
		t.Fatalf("Charge = %v, want ErrDeclined", err)
	}
	r.FencingToken = 4
	if _, err := e.client.Charge(ctxT(t), r); !errors.Is(err, provider.ErrStaleToken) {
		t.Fatalf("Charge = %v, want ErrStaleToken", err)
	}
	e.wantCounts(t, 0, nil)
}

func TestRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	charged, declined := req("pay_keep"), req("pay_keep_decl")
	charged.FencingToken = 5

	var first provider.Charge
	t.Run("before restart", func(t *testing.T) {
		e := newEnv(t, dir)
		first = mustCharge(t, e.client, charged)
		e.setFault(t, provider.Fault{Mode: provider.FaultDecline, Times: 1})
		if _, err := e.client.Charge(ctxT(t), declined); !errors.Is(err, provider.ErrDeclined) {
			t.Fatalf("Charge = %v, want ErrDeclined", err)
		}
		e.setFault(t, provider.Fault{Mode: provider.FaultFail}) // faults do not survive a restart
	})

	t.Run("after restart", func(t *testing.T) {
		e := newEnv(t, dir)
		if f, err := e.client.Fault(ctxT(t)); err != nil || f.Mode != provider.FaultNone {
			t.Errorf("Fault after restart = %+v, %v; want none", f, err)
		}
		got, err := e.client.Lookup(ctxT(t), charged.ProviderKey)
		if err != nil || !got.CreatedAt.Equal(first.CreatedAt) || got.ChargeID != first.ChargeID {
			t.Fatalf("Lookup after restart = %+v, %v; want %+v", got, err, first)
		}
		e.wantCounts(t, 1, map[string]int{charged.ProviderKey: 1})

		stale := charged
		stale.FencingToken = 3
		if _, err := e.client.Charge(ctxT(t), stale); !errors.Is(err, provider.ErrStaleToken) {
			t.Errorf("token 3 after restart = %v, want ErrStaleToken", err)
		}
		if _, err := e.client.Charge(ctxT(t), declined); !errors.Is(err, provider.ErrDeclined) {
			t.Errorf("declined key after restart = %v, want ErrDeclined", err)
		}
		again := mustCharge(t, e.client, charged)
		if !again.Replayed || again.ChargeID != first.ChargeID {
			t.Errorf("charge after restart = %+v, want replay", again)
		}
		e.wantCounts(t, 1, map[string]int{charged.ProviderKey: 1})
	})
}

func TestRestartTornTail(t *testing.T) {
	dir := t.TempDir()
	r := req("pay_torn")
	func() {
		srv, err := NewServer(Config{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if out := srv.store.charge(chargeInput{Key: r.ProviderKey, AmountMinor: 1000, Currency: "EUR"}, false, time.Now()); out.kind != outcomeCharged {
			t.Fatalf("outcome %v", out.kind)
		}
	}()
	path := filepath.Join(dir, DataFileName)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"kind":"charge","key":"provider_payment_half`); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t, dir)
	e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
	mustCharge(t, e.client, req("pay_after_torn"))
	e.wantCounts(t, 2, map[string]int{r.ProviderKey: 1, provider.ProviderKeyFor("pay_after_torn"): 1})

	// The torn line was cut off, so the file is clean JSON lines again.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("line %d is not JSON: %s", i+1, line)
		}
	}
}

func TestLoadCountsDoubleApplication(t *testing.T) {
	// The counters count applications from the log: a log with two charge
	// records for one key (a double charge) must show 2.
	dir := t.TempDir()
	ch := provider.Charge{ChargeID: ChargeIDFor("provider_payment_dup"), ProviderKey: "provider_payment_dup", Status: provider.StatusConfirmed, AmountMinor: 1, Currency: "EUR"}
	var buf bytes.Buffer
	for range 2 {
		b, _ := json.Marshal(record{Kind: recordCharge, Key: ch.ProviderKey, Charge: &ch})
		buf.Write(append(b, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, DataFileName), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, dir)
	e.wantCounts(t, 2, map[string]int{ch.ProviderKey: 2})
}

func TestLoadRejectsCorruption(t *testing.T) {
	dir := t.TempDir()
	data := "not json\n" + `{"kind":"token","key":"provider_payment_x","fencingToken":1}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, DataFileName), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if srv, err := NewServer(Config{DataDir: dir}); err == nil {
		_ = srv.Close()
		t.Fatal("NewServer over a corrupted log succeeded, want an error")
	}
}

func TestConcurrentSameKey(t *testing.T) {
	for _, dir := range []string{"", "disk"} {
		t.Run("dir="+dir, func(t *testing.T) {
			if dir != "" {
				dir = t.TempDir()
			}
			e := newEnv(t, dir)
			r := req("pay_race")
			const n = 20
			var (
				wg      sync.WaitGroup
				start   = make(chan struct{})
				results = make([]provider.Charge, n)
				errs    = make([]error, n)
			)
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], errs[i] = e.client.Charge(ctxT(t), r)
				})
			}
			close(start)
			wg.Wait()
			firsts := 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("goroutine %d: %v", i, errs[i])
				}
				if !results[i].Replayed {
					firsts++
				}
				if results[i].ChargeID != ChargeIDFor(r.ProviderKey) {
					t.Errorf("goroutine %d: ChargeID %s", i, results[i].ChargeID)
				}
			}
			if firsts != 1 {
				t.Errorf("%d answers were first charges (201), want exactly 1", firsts)
			}
			e.wantCounts(t, 1, map[string]int{r.ProviderKey: 1})
		})
	}
}

func TestServeShutsDownOnCancel(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Config{DataDir: dir}) }()

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &provider.Client{BaseURL: "http://" + ln.Addr().String(), HTTP: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
	if err := c.Healthy(ctxT(t)); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
	mustCharge(t, c, req("pay_served"))

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve = %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	tr.CloseIdleConnections()
	if _, err := c.Charge(ctxT(t), req("pay_after")); !errors.Is(err, provider.ErrUnavailable) {
		t.Errorf("Charge after shutdown = %v, want ErrUnavailable (connection refused)", err)
	}

	// The charge survived in the data dir.
	e := newEnv(t, dir)
	e.wantCounts(t, 1, map[string]int{provider.ProviderKeyFor("pay_served"): 1})
}

func TestListenAndServeBadAddr(t *testing.T) {
	if err := ListenAndServe(t.Context(), "256.0.0.1:bad", Config{}); err == nil {
		t.Fatal("ListenAndServe on a bad address succeeded")
	}
}

func TestCloseAbandonsBackgroundCharge(t *testing.T) {
	e := newEnv(t, "")
	e.setFault(t, provider.Fault{Mode: provider.FaultSlow, Times: 1, Delay: time.Hour})
	impatient := &provider.Client{BaseURL: e.ts.URL, HTTP: &http.Client{Transport: e.ts.Client().Transport, Timeout: 50 * time.Millisecond}}
	if _, err := impatient.Charge(ctxT(t), req("pay_hour")); !errors.Is(err, provider.ErrAmbiguous) {
		t.Fatalf("Charge = %v, want ErrAmbiguous", err)
	}
	// Close must not wait an hour; goleak in TestMain checks nothing is left.
	done := make(chan error, 1)
	go func() { done <- e.srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on a pending slow charge")
	}
	if _, err := e.client.Charge(ctxT(t), req("pay_closed")); !errors.Is(err, provider.ErrUnavailable) {
		t.Errorf("Charge after Close = %v, want ErrUnavailable", err)
	}
}

func TestClientLookupEscapesKey(t *testing.T) {
	e := newEnv(t, "")
	if _, err := e.client.Lookup(ctxT(t), "provider_payment_a/b?c"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Lookup of odd key = %v, want provider.ErrNotFound", err)
	}
}

// TestReference: a charge keeps the reference of the request that made it,
// through replays with another reference and lookups.
func TestReference(t *testing.T) {
	e := newEnv(t, t.TempDir())
	first := req("pay_ref1")
	first.Reference = "ref_k1"
	if ch := mustCharge(t, e.client, first); ch.Reference != "ref_k1" || ch.Replayed {
		t.Fatalf("first charge: reference %q, replayed %v", ch.Reference, ch.Replayed)
	}
	second := req("pay_ref1")
	second.Reference = "ref_k2"
	if ch := mustCharge(t, e.client, second); ch.Reference != "ref_k1" || !ch.Replayed {
		t.Errorf("replay with another reference: reference %q, replayed %v; want ref_k1, replayed", ch.Reference, ch.Replayed)
	}
	if ch, err := e.client.Lookup(ctxT(t), first.ProviderKey); err != nil || ch.Reference != "ref_k1" {
		t.Errorf("lookup: %v, reference %q", err, ch.Reference)
	}
	e.wantCounts(t, 1, map[string]int{first.ProviderKey: 1})
	bad := req("pay_ref2")
	bad.Reference = "no spaces"
	if _, err := e.client.Charge(ctxT(t), bad); !errors.Is(err, provider.ErrBadRequest) {
		t.Errorf("an invalid reference: %v, want ErrBadRequest", err)
	}
}

package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// sentinels are all the classes a caller may test for.
var sentinels = []struct {
	name string
	err  error
}{
	{"ErrDeclined", ErrDeclined},
	{"ErrNotFound", ErrNotFound},
	{"ErrUnavailable", ErrUnavailable},
	{"ErrStaleToken", ErrStaleToken},
	{"ErrKeyReused", ErrKeyReused},
	{"ErrBadRequest", ErrBadRequest},
	{"ErrAmbiguous", ErrAmbiguous},
}

// checkClass asserts err is in class want (nil: success) and in no other.
func checkClass(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("err = %v, want success", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("err = nil, want %v", want)
	}
	for _, s := range sentinels {
		if got := errors.Is(err, s.err); got != (s.err == want) {
			t.Errorf("errors.Is(%v, %s) = %v, want %v", err, s.name, got, !got)
		}
	}
}

// answer is a handler answering a fixed status and body.
func answer(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func TestClientClassifiesAnswers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		want    error
	}{
		{name: "201", handler: answer(201, `{"chargeId":"ch_1","providerKey":"provider_payment_p","status":"CONFIRMED","amountMinor":1000,"currency":"EUR"}`)},
		{name: "503 unavailable", handler: answer(503, `{"errorCode":"PROVIDER_UNAVAILABLE","message":"down"}`), want: ErrUnavailable},
		{name: "500 non-JSON", handler: answer(500, `oops`), want: ErrUnavailable},
		{name: "502 empty", handler: answer(502, ``), want: ErrUnavailable},
		{name: "429", handler: answer(429, `{}`), want: ErrUnavailable},
		{name: "402 declined", handler: answer(402, `{"errorCode":"PAYMENT_DECLINED","message":"no"}`), want: ErrDeclined},
		{name: "404", handler: answer(404, `{"errorCode":"CHARGE_NOT_FOUND","message":"no"}`), want: ErrNotFound},
		{name: "409 stale", handler: answer(409, `{"errorCode":"FENCING_TOKEN_STALE","message":"no"}`), want: ErrStaleToken},
		{name: "409 reused", handler: answer(409, `{"errorCode":"PROVIDER_KEY_REUSED","message":"no"}`), want: ErrKeyReused},
		{name: "400", handler: answer(400, `{"errorCode":"PROVIDER_KEY_MISSING","message":"no"}`), want: ErrBadRequest},
		{name: "success body unreadable", handler: answer(201, `{"chargeId":`), want: ErrAmbiguous},
		{
			name: "success body cut short",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "500")
				w.WriteHeader(201)
				_, _ = w.Write([]byte(`{"chargeId":"ch_1"`))
			},
			want: ErrAmbiguous,
		},
		{
			name: "connection dropped before answer",
			handler: func(w http.ResponseWriter, r *http.Request) {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					_ = conn.Close()
				}
			},
			want: ErrAmbiguous,
		},
		{
			name: "client timeout after sending",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			},
			timeout: 50 * time.Millisecond,
			want:    ErrAmbiguous,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.handler)
			t.Cleanup(ts.Close)
			hc := ts.Client()
			if tc.timeout > 0 {
				hc = &http.Client{Transport: ts.Client().Transport, Timeout: tc.timeout}
			}
			c := &Client{BaseURL: ts.URL + "/", HTTP: hc}
			_, err := c.Charge(ctxT(t), req("p"))
			checkClass(t, err, tc.want)
			var apiErr *APIError
			if errors.As(err, &apiErr) && apiErr.StatusCode == 0 {
				t.Errorf("APIError without status: %#v", apiErr)
			}
		})
	}
}

func TestClientSendsHeadersAndBody(t *testing.T) {
	type seen struct {
		method, path, key, token, ctype, body string
	}
	got := make(chan seen, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		buf := make([]byte, 512)
		for {
			n, err := r.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- seen{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("Idem-Fencing-Token"), r.Header.Get("Content-Type"), b.String()}
		answer(201, `{"chargeId":"ch_x"}`)(w, r)
	}))
	t.Cleanup(ts.Close)
	c := &Client{BaseURL: ts.URL, HTTP: ts.Client()}

	tests := []struct {
		name      string
		token     int64
		wantToken string
	}{
		{"no token", 0, ""},
		{"token", 42, "42"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := req("p1")
			r.FencingToken = tc.token
			if _, err := c.Charge(ctxT(t), r); err != nil {
				t.Fatal(err)
			}
			s := <-got
			want := seen{"POST", "/v1/charges", "provider_payment_p1", tc.wantToken, "application/json",
				`{"amountMinor":1000,"currency":"EUR","accountId":"acc_1"}`}
			if s != want {
				t.Errorf("server saw %+v, want %+v", s, want)
			}
		})
	}
}

func TestClientNotSent(t *testing.T) {
	// A closed port: nothing could have reached a provider.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &Client{BaseURL: "http://" + addr, HTTP: &http.Client{Transport: tr}}
	_, err = c.Charge(ctxT(t), req("p"))
	checkClass(t, err, ErrUnavailable)

	// A context already done: the request never leaves.
	ts := httptest.NewServer(answer(201, `{}`))
	t.Cleanup(ts.Close)
	c = &Client{BaseURL: ts.URL, HTTP: ts.Client()}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = c.Charge(ctx, req("p"))
	checkClass(t, err, ErrUnavailable)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want it to wrap context.Canceled", err)
	}
}

func TestClientContextDeadlineAfterSending(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client leaving only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	c := &Client{BaseURL: ts.URL, HTTP: ts.Client()}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	t.Cleanup(cancel)
	_, err := c.Charge(ctx, req("p"))
	checkClass(t, err, ErrAmbiguous)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
}

func TestClientLookupEmptyBaseURL(t *testing.T) {
	if _, err := (&Client{}).Lookup(ctxT(t), "k"); err == nil {
		t.Error("Lookup with empty BaseURL succeeded")
	}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func req(paymentID string) ChargeRequest {
	return ChargeRequest{ProviderKey: ProviderKeyFor(paymentID), AmountMinor: 1000, Currency: "EUR", AccountID: "acc_1"}
}

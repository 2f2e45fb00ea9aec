package stripeexample_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v84"

	"github.com/idemcoord/idem/examples/stripe/fakestripe"
	"github.com/idemcoord/idem/examples/stripe/stripeclient"
)

// The tests in this file pin down what stripe-go v84's retry loop does,
// without idemd: against the fake upstream directly, and against scripted
// answers shaped like the sidecar's own. README.md's "What the SDK
// retries" section is written from them; if a stripe-go upgrade changes
// the loop, they fail first.

// sdkKeyRE is the Idempotency-Key stripe-go makes for a write without one:
// stripe.NewIdempotencyKey, "<UnixNano>_<6 URL-safe base64 characters>".
var sdkKeyRE = regexp.MustCompile(`^[0-9]+_[A-Za-z0-9_-]{6}$`)

func chargeParams(amount int64, source string, meta ...string) *stripe.ChargeCreateParams {
	p := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(amount),
		Currency:    stripe.String(string(stripe.CurrencyUSD)),
		Source:      &stripe.PaymentSourceSourceParams{Token: stripe.String(source)},
		Description: stripe.String("walkthrough order"),
	}
	for i := 0; i+1 < len(meta); i += 2 {
		p.AddMetadata(meta[i], meta[i+1])
	}
	return p
}

// TestSDKKeysAndRetriesAgainstTheFake shows the SDK's own loop on a
// non-idempotent upstream: one key per call, reused on every retry, and a
// retry after a lost answer or a timeout executes again.
func TestSDKKeysAndRetriesAgainstTheFake(t *testing.T) {
	fake := fakestripe.New()
	base, err := fake.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()

	t.Run("lost answer", func(t *testing.T) {
		rec := &stripeclient.Recorder{LoseAnswers: 1}
		sc := stripeclient.New(stripeclient.Config{URL: base, Key: "sk_test_x", MaxNetworkRetries: 2, Transport: rec, NoRetrySleep: true, Logger: stripeclient.Logf(t.Logf)})
		ch, err := sc.V1Charges.Create(context.Background(), chargeParams(2000, "tok_visa", "order_id", "lost"))
		if err != nil {
			t.Fatal(err)
		}
		at := rec.Attempts()
		if len(at) != 2 || !errors.Is(at[0].Err, stripeclient.ErrLostAnswer) || at[1].Status != http.StatusOK {
			t.Fatalf("attempts %v, want a lost 200 and a retried 200", at)
		}
		key := at[0].IdempotencyKey
		if !sdkKeyRE.MatchString(key) || at[1].IdempotencyKey != key || at[0].Body != at[1].Body {
			t.Errorf("keys %q, %q and bodies %q, %q: want one SDK-made key and one body for both attempts", key, at[1].IdempotencyKey, at[0].Body, at[1].Body)
		}
		t.Logf("the SDK's form body: %s", at[0].Body)
		reqs := fake.RequestsWithKey(key)
		if len(reqs) != 2 || reqs[0].ChargeID == reqs[1].ChargeID || ch.ID != reqs[1].ChargeID {
			t.Errorf("the fake saw %+v; want two executions (it has no idempotency) and the SDK holding the second charge %s", reqs, ch.ID)
		}
		if !reqs[0].Authorization {
			t.Error("the SDK sent no Authorization")
		}

		// A new call is a new key; SetIdempotencyKey overrides it.
		rec.Reset()
		p := chargeParams(2000, "tok_visa")
		p.SetIdempotencyKey("order-42")
		if _, err := sc.V1Charges.Create(context.Background(), chargeParams(2000, "tok_visa")); err != nil {
			t.Fatal(err)
		}
		if _, err := sc.V1Charges.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		at = rec.Attempts()
		if len(at) != 2 || at[0].IdempotencyKey == key || !sdkKeyRE.MatchString(at[0].IdempotencyKey) || at[1].IdempotencyKey != "order-42" {
			t.Errorf("attempts %v: want a fresh SDK key, then order-42", at)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		rec := &stripeclient.Recorder{}
		sc := stripeclient.New(stripeclient.Config{URL: base, Key: "sk_test_x", Timeout: 100 * time.Millisecond, MaxNetworkRetries: 1, Transport: rec, NoRetrySleep: true})
		_, err := sc.V1Charges.Create(context.Background(), chargeParams(2000, "tok_visa", fakestripe.MetaDelay, "300"))
		at := rec.Attempts()
		if err == nil || len(at) != 2 || at[0].Err == nil || at[1].Err == nil || at[0].IdempotencyKey != at[1].IdempotencyKey {
			t.Fatalf("err %v, attempts %v: want two timed-out attempts with one key", err, at)
		}
		deadline := time.Now().Add(5 * time.Second)
		for fake.Count(at[0].IdempotencyKey) != 2 || len(fake.RequestsWithKey(at[0].IdempotencyKey)[1].ChargeID) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the fake saw %+v, want two charges made after their clients left", fake.RequestsWithKey(at[0].IdempotencyKey))
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

type scripted struct {
	status int
	header map[string]string
	body   string
}

const (
	okCharge       = `{"id":"ch_1","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}`
	sidecarReused  = `{"errorCode":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST","message":"This idempotency key was used with a different request."}`
	sidecarProblem = `{"type":"https://example.test/errors/key-reused","title":"Key reused","status":409,"detail":"...","errorCode":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST","message":"..."}`
	sidecarUnknown = `{"errorCode":"PAYMENT_OUTCOME_UNKNOWN","message":"The outcome of the request with this idempotency key is not known yet; retry with the same key later."}`
	stripeAPIError = `{"error":{"type":"api_error","message":"An unknown error occurred."}}`
	stripeDecline  = `{"error":{"type":"card_error","code":"card_declined","message":"Your card was declined.","decline_code":"generic_decline"}}`
	stripeIdemErr  = `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`
	stripeLockErr  = `{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"This object cannot be accessed right now."}}`
	stripeRateErr  = `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests."}}`
)

// TestSDKRetryDecision pins down stripe-go v84's shouldRetry as it works
// in practice. For an answer of status 400 or more the SDK first turns the
// body into an error (ResponseToError), so the status-based rules of
// shouldRetry (409, 5xx, Stripe-Should-Retry) are never reached for them:
// what decides is whether the body holds a Stripe error object
// ({"error":{...}}). A Stripe error is retried only when it is a 429
// lock_timeout; any other body (plain text, or JSON without an "error"
// object, like the sidecar's {"errorCode","message"}) becomes a plain Go
// error, which is retried like a network error. Below 400 the SDK retries
// only on Stripe-Should-Retry: true.
func TestSDKRetryDecision(t *testing.T) {
	for _, tc := range []struct {
		name         string
		script       []scripted
		wantAttempts int
		// wantStatus is the *stripe.Error's HTTPStatusCode, 0 for a plain
		// error, -1 for success.
		wantStatus int
	}{
		{"plain-text 500 is retried", []scripted{{500, nil, "upstream crashed"}, {200, nil, okCharge}}, 2, -1},
		{"plain-text 503 is retried", []scripted{{503, nil, "Service Unavailable"}, {200, nil, okCharge}}, 2, -1},
		{"Stripe api_error 500 is not retried", []scripted{{500, nil, stripeAPIError}}, 1, 500},
		{"Stripe-Should-Retry is ignored on an error answer", []scripted{{500, map[string]string{"Stripe-Should-Retry": "true"}, stripeAPIError}}, 1, 500},
		{"402 card_error is not retried", []scripted{{402, nil, stripeDecline}}, 1, 402},
		{"409 idempotency_error is not retried", []scripted{{409, nil, stripeIdemErr}}, 1, 409},
		{"409 without a Stripe error object is retried to the end", []scripted{{409, nil, sidecarReused}}, 3, 0},
		{"409 problem+json is retried to the end", []scripted{{409, map[string]string{"Content-Type": "application/problem+json"}, sidecarProblem}}, 3, 0},
		{"429 lock_timeout is retried", []scripted{{429, nil, stripeLockErr}, {200, nil, okCharge}}, 2, -1},
		{"429 rate_limit is not retried", []scripted{{429, nil, stripeRateErr}}, 1, 429},
		{"200 with Stripe-Should-Retry: true is retried", []scripted{{200, map[string]string{"Stripe-Should-Retry": "true"}, okCharge}, {200, nil, okCharge}}, 2, -1},
		{"202 without a charge is a success with an empty charge", []scripted{{202, nil, sidecarUnknown}}, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := tc.script[min(int(n.Add(1))-1, len(tc.script)-1)]
				ct := "application/json"
				if !strings.HasPrefix(s.body, "{") {
					ct = "text/plain; charset=utf-8"
				}
				w.Header().Set("Content-Type", ct)
				for k, v := range s.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(s.status)
				_, _ = w.Write([]byte(s.body))
			}))
			defer srv.Close()
			rec := &stripeclient.Recorder{}
			sc := stripeclient.New(stripeclient.Config{URL: srv.URL, Key: "sk_test_x", MaxNetworkRetries: 2, Transport: rec, NoRetrySleep: true})
			ch, err := sc.V1Charges.Create(context.Background(), chargeParams(2000, "tok_visa"))
			if got := len(rec.Attempts()); got != tc.wantAttempts {
				t.Errorf("%d attempts, want %d", got, tc.wantAttempts)
			}
			var se *stripe.Error
			switch {
			case tc.wantStatus == -1 && err != nil:
				t.Errorf("error %v, want success", err)
			case tc.wantStatus == -1:
				if tc.script[0].status == 202 && ch.ID != "" {
					t.Errorf("charge %q from a 202 without a charge", ch.ID)
				}
			case tc.wantStatus == 0 && (err == nil || errors.As(err, &se)):
				t.Errorf("error %T %v, want a plain error (not *stripe.Error)", err, err)
			case tc.wantStatus > 0 && (!errors.As(err, &se) || se.HTTPStatusCode != tc.wantStatus):
				t.Errorf("error %T %v, want *stripe.Error with HTTPStatusCode %d", err, err, tc.wantStatus)
			}
		})
	}
}

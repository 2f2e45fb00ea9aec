package fakestripe_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/examples/stripe/fakestripe"
)

func start(t *testing.T) (*fakestripe.Server, string) {
	t.Helper()
	s := fakestripe.New()
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, base
}

type answer struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, base, key string, form url.Values) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Idem-Tenant", "tenant-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func charge(extra ...string) url.Values {
	f := url.Values{"amount": {"2000"}, "currency": {"USD"}, "source": {"tok_visa"}, "description": {"order 7"}, "metadata[order_id]": {"7"}}
	for i := 0; i+1 < len(extra); i += 2 {
		f.Set(extra[i], extra[i+1])
	}
	return f
}

func TestChargeExecutesEveryTime(t *testing.T) {
	s, base := start(t)
	var ids []string
	for range 2 {
		a := post(t, base, "k1", charge())
		if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" || !strings.HasPrefix(a.header.Get("Request-Id"), "req_") {
			t.Fatalf("%d %v: %s", a.status, a.header, a.body)
		}
		var ch fakestripe.Charge
		if err := json.Unmarshal([]byte(a.body), &ch); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ch.ID, "ch_") || len(ch.ID) != 27 || ch.Object != "charge" || ch.Amount != 2000 || ch.AmountCaptured != 2000 ||
			ch.Currency != "usd" || ch.Status != "succeeded" || !ch.Paid || ch.Description == nil || *ch.Description != "order 7" || ch.Metadata["order_id"] != "7" || ch.Customer != nil {
			t.Errorf("charge %+v", ch)
		}
		ids = append(ids, ch.ID)
	}
	if ids[0] == ids[1] {
		t.Errorf("two executions made one charge id %s", ids[0])
	}
	if got := s.Count("k1"); got != 2 {
		t.Errorf("Count(k1) = %d, want 2 (the fake has no idempotency of its own)", got)
	}
	reqs := s.RequestsWithKey("k1")
	if len(reqs) != 2 || reqs[0].Tenant != "tenant-a" || reqs[0].Authorization || reqs[1].ChargeID != ids[1] || reqs[1].Status != 200 || reqs[0].Form.Get("amount") != "2000" {
		t.Errorf("requests %+v", reqs)
	}

	// The same through GET /_counts and /_requests.
	var counts map[string]int
	getJSON(t, base+"/_counts", &counts)
	if counts["k1"] != 2 || len(counts) != 1 {
		t.Errorf("/_counts %v", counts)
	}
	var listed []fakestripe.Request
	getJSON(t, base+"/_requests", &listed)
	if len(listed) != 2 || listed[1].ChargeID != ids[1] {
		t.Errorf("/_requests %+v", listed)
	}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func TestDeclined(t *testing.T) {
	s, base := start(t)
	a := post(t, base, "k2", charge("source", fakestripe.DeclinedSource))
	want := `{"error":{"code":"card_declined","decline_code":"generic_decline","message":"Your card was declined.","type":"card_error"}}` + "\n"
	if a.status != http.StatusPaymentRequired || a.body != want {
		t.Errorf("%d %s, want 402 %s", a.status, a.body, want)
	}
	if s.Count("k2") != 1 {
		t.Errorf("Count = %d", s.Count("k2"))
	}
}

func TestFailOnce(t *testing.T) {
	s, base := start(t)
	for _, tc := range []struct {
		mode, key, contentType, body string
	}{
		{fakestripe.FailPlain, "k3", "text/plain; charset=utf-8", "upstream crashed\n"},
		{fakestripe.FailAPIError, "k4", "application/json", `{"error":{"message":"An unknown error occurred while processing the charge.","type":"api_error"}}` + "\n"},
	} {
		f := charge("metadata["+fakestripe.MetaFailOnce+"]", tc.mode)
		a := post(t, base, tc.key, f)
		if a.status != http.StatusInternalServerError || a.header.Get("Content-Type") != tc.contentType || a.body != tc.body {
			t.Errorf("%s: first %d %q %q", tc.mode, a.status, a.header.Get("Content-Type"), a.body)
		}
		if a := post(t, base, tc.key, f); a.status != http.StatusOK {
			t.Errorf("%s: second %d %s, want 200", tc.mode, a.status, a.body)
		}
		if n := s.Count(tc.key); n != 2 {
			t.Errorf("%s: Count = %d, want 2", tc.mode, n)
		}
	}
	// Another key fails once too.
	if a := post(t, base, "k5", charge("metadata[fail_once]", "plain")); a.status != http.StatusInternalServerError {
		t.Errorf("k5: %d, want 500", a.status)
	}
}

// TestFailDrop: the charge is made and its answer never sent.
func TestFailDrop(t *testing.T) {
	s, base := start(t)
	f := charge("metadata["+fakestripe.MetaFailOnce+"]", fakestripe.FailDrop)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(f.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "k6")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("first: %s, want the connection closed without an answer", resp.Status)
	}
	reqs := s.RequestsWithKey("k6")
	if len(reqs) != 1 || !reqs[0].Dropped || reqs[0].ChargeID == "" || reqs[0].Status != http.StatusOK {
		t.Errorf("requests %+v: want one charge made and its answer dropped", reqs)
	}
	if a := post(t, base, "k6", f); a.status != http.StatusOK {
		t.Errorf("second: %d %s, want 200", a.status, a.body)
	}
}

func TestDelayOutlivesTheClient(t *testing.T) {
	s, base := start(t)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(charge("metadata[delay_ms]", "400").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "k6")
	began := time.Now()
	_, err := (&http.Client{Timeout: 100 * time.Millisecond}).Do(req)
	if err == nil {
		t.Fatal("the client did not time out")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r := s.RequestsWithKey("k6"); len(r) == 1 && r[0].Status == http.StatusOK && r[0].ChargeID != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the charge did not complete after its client left: %+v", s.RequestsWithKey("k6"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(began); took < 400*time.Millisecond {
		t.Errorf("answered after %v, want the 400ms delay", took)
	}
}

func TestInvalid(t *testing.T) {
	s, base := start(t)
	for name, f := range map[string]url.Values{
		"no amount":    {"currency": {"usd"}, "source": {"tok_visa"}},
		"zero amount":  charge("amount", "0"),
		"bad currency": charge("currency", "dollars"),
		"no source":    {"amount": {"1"}, "currency": {"usd"}},
		"unknown":      charge("colour", "red"),
		"duplicate":    {"amount": {"1", "2"}, "currency": {"usd"}, "source": {"tok_visa"}},
		"bad delay":    charge("metadata[delay_ms]", "soon"),
		"bad failure":  charge("metadata[fail_once]", "maybe"),
	} {
		a := post(t, base, "", f)
		var body struct {
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(a.body), &body); err != nil || a.status != http.StatusBadRequest || body.Error.Type != "invalid_request_error" || body.Error.Message == "" {
			t.Errorf("%s: %d %s", name, a.status, a.body)
		}
	}
	// JSON is refused: the API is form-encoded.
	resp, err := http.Post(base+"/v1/charges", "application/json", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("JSON body: %s, want 400", resp.Status)
	}
	if resp, err := http.Get(base + "/v1/customers"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/customers: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	if s.Count("") != 9 {
		t.Errorf("Count(\"\") = %d, want 9: every request received counts", s.Count(""))
	}
}

func TestStartRefusesOtherInterfaces(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "[::]:0"} {
		s := fakestripe.New()
		if _, err := s.Start(addr); !errors.Is(err, fakestripe.ErrNotLoopback) {
			t.Errorf("Start(%q) = %v, want ErrNotLoopback", addr, err)
			_ = s.Close()
		}
	}
}

func TestCloseReleasesDelayedRequests(t *testing.T) {
	s := fakestripe.New()
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(charge("metadata[delay_ms]", "60000").Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for len(s.Requests()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	began := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Close took %v with a request delayed for a minute", took)
	}
}

// Package fakestripe is a small Stripe-like charges API, the upstream the
// Stripe walkthrough puts idemd's sidecar in front of. It has no
// idempotency of its own: every POST /v1/charges it receives executes (a
// new charge id), and it counts executions per received Idempotency-Key
// (through the sidecar: the derived key), so a count above 1 for a key whose
// earlier answer was stored is a duplicate execution.
//
//	POST /v1/charges  form-encoded: amount, currency, source or customer,
//	                  description, metadata[...]; 200 and a Stripe charge
//	GET  /_counts     {"<Idempotency-Key>": executions, ...}
//	GET  /_requests   every request received, in order ([Request])
//
// Test switches, read from the form like any other field (so they are part
// of the request's fingerprint):
//
//   - metadata[delay_ms]=N: answer N milliseconds later (at most 60000),
//     whether or not the caller is still there: a charge is not undone
//     because its client hung up;
//   - source=tok_chargeDeclined: 402 with Stripe's card_error body;
//   - metadata[fail_once]=plain: the first request with a given
//     Idempotency-Key answers 500 with a text/plain body (what a crashed
//     process behind a gateway gives), later ones execute normally;
//   - metadata[fail_once]=api_error: the same with Stripe's JSON api_error
//     body.
//
// Every answer is JSON but the plain 500, with a Request-Id header.
package fakestripe

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DeclinedSource is the test token whose charge is declined (402
// card_declined), as in Stripe's test mode.
const DeclinedSource = "tok_chargeDeclined"

// Test switches in a charge's metadata.
const (
	// MetaDelay delays the answer by its value in milliseconds.
	MetaDelay = "delay_ms"
	// MetaFailOnce makes the first request of an Idempotency-Key fail:
	// FailPlain or FailAPIError (a 500), or FailDrop (no answer).
	MetaFailOnce = "fail_once"
)

// Values of MetaFailOnce.
const (
	// FailPlain answers a text/plain 500, not a Stripe error object.
	FailPlain = "plain"
	// FailAPIError answers a 500 with Stripe's api_error body.
	FailAPIError = "api_error"
	// FailDrop makes the charge and then closes the connection without an
	// answer: the caller cannot know that the card was charged.
	FailDrop = "drop"
)

// MaxDelay bounds MetaDelay.
const MaxDelay = time.Minute

// Request is one request POST /v1/charges received, as /_requests lists it.
type Request struct {
	// IdempotencyKey is the Idempotency-Key header ("" without one).
	IdempotencyKey string `json:"idempotencyKey"`
	// Tenant and FencingToken are the Idem-Tenant and Idem-Fencing-Token
	// headers the sidecar adds.
	Tenant       string `json:"tenant"`
	FencingToken string `json:"fencingToken"`
	// Authorization reports whether an Authorization header arrived (the
	// sidecar passes the client's only when the route says so).
	Authorization bool `json:"authorization"`
	// Form is the decoded body.
	Form url.Values `json:"form"`
	// Status is the status answered, ChargeID the charge made (200 only).
	Status   int    `json:"status"`
	ChargeID string `json:"chargeId,omitempty"`
	// Dropped: the charge was made and its answer dropped (FailDrop).
	Dropped bool `json:"dropped,omitempty"`
}

// Server serves the API. Its zero value is not usable: call New.
type Server struct {
	mu       sync.Mutex
	counts   map[string]int
	requests []Request
	failed   map[string]bool

	closing   chan struct{}
	closeOnce sync.Once
	srv       *http.Server
	ln        net.Listener
	done      chan struct{}
}

// New returns a Server with no charges.
func New() *Server {
	return &Server{counts: map[string]int{}, failed: map[string]bool{}, closing: make(chan struct{})}
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/v1/charges" && r.Method == http.MethodPost:
		s.createCharge(w, r)
	case r.URL.Path == "/_counts" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, s.Counts())
	case r.URL.Path == "/_requests" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, s.Requests())
	default:
		writeJSON(w, http.StatusNotFound, stripeError("invalid_request_error", "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").", ""))
	}
}

// Counts returns the number of POST /v1/charges received per
// Idempotency-Key.
func (s *Server) Counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.counts))
	for k, n := range s.counts {
		out[k] = n
	}
	return out
}

// Count returns the number of POST /v1/charges received with key.
func (s *Server) Count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[key]
}

// Requests returns every request received, in order of arrival (a request
// still being delayed has Status 0).
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// RequestsWithKey returns the requests received with key, in order.
func (s *Server) RequestsWithKey(key string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.IdempotencyKey == key {
			out = append(out, r)
		}
	}
	return out
}

var currencyRE = regexp.MustCompile(`^[a-z]{3}$`)

// createCharge executes one charge.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	rec := Request{
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Tenant:         r.Header.Get("Idem-Tenant"),
		FencingToken:   r.Header.Get("Idem-Fencing-Token"),
		Authorization:  r.Header.Get("Authorization") != "",
	}
	s.mu.Lock()
	s.counts[rec.IdempotencyKey]++
	i := len(s.requests)
	s.requests = append(s.requests, rec)
	s.mu.Unlock()
	status, body, plain := s.charge(r, rec.IdempotencyKey, &rec)
	rec.Status = status
	s.mu.Lock()
	s.requests[i] = rec
	s.mu.Unlock()

	if rec.Dropped {
		// net/http closes the connection without an answer.
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Request-Id", "req_"+randomID(14))
	if plain {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "upstream crashed\n")
		return
	}
	writeJSON(w, status, body)
}

// charge decodes and runs one charge; plain asks for the text/plain 500.
func (s *Server) charge(r *http.Request, key string, rec *Request) (status int, body any, plain bool) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		return http.StatusBadRequest, stripeError("invalid_request_error", "", "Send the parameters form-encoded (application/x-www-form-urlencoded).", ""), false
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil || len(raw) > 1<<20 {
		return http.StatusBadRequest, stripeError("invalid_request_error", "", "The body could not be read or is too large.", ""), false
	}
	form, err := url.ParseQuery(string(raw))
	if err != nil {
		return http.StatusBadRequest, stripeError("invalid_request_error", "", "The body is not valid form encoding.", ""), false
	}
	rec.Form = form
	c, param, msg := parseCharge(form)
	if msg != "" {
		return http.StatusBadRequest, stripeError("invalid_request_error", "parameter_invalid", msg, param), false
	}

	if c.delay > 0 {
		// Not r.Context(): the work goes on when the caller hangs up.
		t := time.NewTimer(c.delay)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		}
	}
	if c.failOnce != "" {
		s.mu.Lock()
		first := !s.failed[key]
		s.failed[key] = true
		s.mu.Unlock()
		if first {
			switch c.failOnce {
			case FailDrop:
				rec.Dropped = true
			case FailPlain:
				return http.StatusInternalServerError, nil, true
			default:
				return http.StatusInternalServerError, stripeError("api_error", "", "An unknown error occurred while processing the charge.", ""), false
			}
		}
	}
	if c.source == DeclinedSource {
		return http.StatusPaymentRequired, map[string]any{"error": map[string]string{
			"type":         "card_error",
			"code":         "card_declined",
			"message":      "Your card was declined.",
			"decline_code": "generic_decline",
		}}, false
	}
	ch := newCharge(c)
	rec.ChargeID = ch.ID
	return http.StatusOK, ch, false
}

// chargeParams is a decoded POST /v1/charges.
type chargeParams struct {
	amount                        int64
	currency, source, customer    string
	description                   string
	metadata                      map[string]string
	delay                         time.Duration
	failOnce                      string
	captureSet, capture           bool
	receiptEmail, statementSuffix string
}

// parseCharge validates form as Stripe would: it answers the offending
// parameter and a message, or an empty message.
func parseCharge(form url.Values) (c chargeParams, param, msg string) {
	c.metadata = map[string]string{}
	for name, vals := range form {
		if len(vals) != 1 {
			return c, name, "Parameter " + name + " was given more than once."
		}
		v := vals[0]
		switch {
		case name == "amount":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > 99999999 {
				return c, name, "Invalid positive integer: amount must be from 1 to 99999999."
			}
			c.amount = n
		case name == "currency":
			c.currency = strings.ToLower(v)
			if !currencyRE.MatchString(c.currency) {
				return c, name, "Invalid currency: want a three-letter ISO code."
			}
		case name == "source":
			c.source = v
		case name == "customer":
			c.customer = v
		case name == "description":
			c.description = v
		case name == "capture":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return c, name, "Invalid boolean: capture."
			}
			c.captureSet, c.capture = true, b
		case name == "receipt_email":
			c.receiptEmail = v
		case name == "statement_descriptor_suffix":
			c.statementSuffix = v
		case strings.HasPrefix(name, "metadata[") && strings.HasSuffix(name, "]") && len(name) > len("metadata[]"):
			c.metadata[name[len("metadata["):len(name)-1]] = v
		default:
			return c, name, "Received unknown parameter: " + name
		}
	}
	switch {
	case c.amount == 0:
		return c, "amount", "Missing required param: amount."
	case c.currency == "":
		return c, "currency", "Missing required param: currency."
	case c.source == "" && c.customer == "":
		return c, "source", "Must provide source or customer."
	}
	if v, ok := c.metadata[MetaDelay]; ok {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 || time.Duration(ms)*time.Millisecond > MaxDelay {
			return c, "metadata[" + MetaDelay + "]", "metadata[delay_ms]: want milliseconds from 0 to 60000."
		}
		c.delay = time.Duration(ms) * time.Millisecond
	}
	if v, ok := c.metadata[MetaFailOnce]; ok {
		if v != FailPlain && v != FailAPIError && v != FailDrop {
			return c, "metadata[" + MetaFailOnce + "]", "metadata[fail_once]: want plain, api_error or drop."
		}
		c.failOnce = v
	}
	return c, "", ""
}

// Charge is the JSON of a charge, a subset of Stripe's.
type Charge struct {
	ID                        string            `json:"id"`
	Object                    string            `json:"object"`
	Amount                    int64             `json:"amount"`
	AmountCaptured            int64             `json:"amount_captured"`
	AmountRefunded            int64             `json:"amount_refunded"`
	Captured                  bool              `json:"captured"`
	Created                   int64             `json:"created"`
	Currency                  string            `json:"currency"`
	Customer                  *string           `json:"customer"`
	Description               *string           `json:"description"`
	Livemode                  bool              `json:"livemode"`
	Metadata                  map[string]string `json:"metadata"`
	Paid                      bool              `json:"paid"`
	ReceiptEmail              *string           `json:"receipt_email"`
	Refunded                  bool              `json:"refunded"`
	StatementDescriptorSuffix *string           `json:"statement_descriptor_suffix"`
	Status                    string            `json:"status"`
}

func newCharge(c chargeParams) Charge {
	captured := !c.captureSet || c.capture
	ch := Charge{
		ID:                        "ch_" + randomID(24),
		Object:                    "charge",
		Amount:                    c.amount,
		Captured:                  captured,
		Created:                   time.Now().Unix(),
		Currency:                  c.currency,
		Metadata:                  c.metadata,
		Paid:                      true,
		Status:                    "succeeded",
		Livemode:                  false,
		Refunded:                  false,
		Customer:                  optional(c.customer),
		Description:               optional(c.description),
		ReceiptEmail:              optional(c.receiptEmail),
		StatementDescriptorSuffix: optional(c.statementSuffix),
	}
	if captured {
		ch.AmountCaptured = c.amount
	}
	return ch
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// stripeError is Stripe's error body; empty members are left out.
func stripeError(typ, code, msg, param string) map[string]any {
	e := map[string]string{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	if param != "" {
		e["param"] = param
	}
	return map[string]any{"error": e}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"type":"api_error","message":"encoding failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// randomID is n random letters and digits, as Stripe's ids have.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// ErrNotLoopback is Start's error for an address outside the loopback
// interface: the fake has no authentication and must not be reachable from
// elsewhere.
var ErrNotLoopback = errors.New("fakestripe: listen only on a loopback address (127.0.0.1, ::1 or localhost)")

// Start listens on addr, a loopback address ("127.0.0.1:0" picks a free
// port), and serves s in the background until Close. It returns the base
// URL, http://host:port.
func (s *Server) Start(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("fakestripe: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", ErrNotLoopback
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("fakestripe: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving: delayed requests answer at once, and Close waits
// for the handlers to return (at most ten seconds).
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

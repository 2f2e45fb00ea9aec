package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

// Named error envelopes (Route.ErrorEnvelope): the shape a route's own
// error answers take.
const (
	// EnvelopeProblem is RFC 9457 application/problem+json, the node's
	// contract (the default).
	EnvelopeProblem = "problem"
	// EnvelopeStripe is Stripe's error object, which the Stripe SDKs parse
	// into a typed error (stripe-go's *stripe.Error, with the answer's
	// status as HTTPStatusCode):
	//
	//	{"error":{"type":"idempotency_error","code":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST",
	//	  "message":"...","doc_url":"https://.../errors.md#idempotency_key_reused_with_different_request"}}
	//
	// code is the errorCode, message the problem's detail, doc_url its
	// type URI; type is idempotency_error for the IDEMPOTENCY_KEY_* codes
	// and IDEMPOTENCY_REQUEST_IN_PROGRESS, invalid_request_error for the
	// other 4xx and api_error for the rest.
	EnvelopeStripe = "stripe"
)

// MaxEnvelopeFile bounds an error envelope template file
// (Route.ErrorEnvelopeFile), in bytes.
const MaxEnvelopeFile = 16 << 10

// Placeholders of an error envelope template: each stands for the problem
// member of the same name ({{code}} is the errorCode). A string value that
// is exactly "{{status}}" becomes the status as a JSON number; elsewhere
// in a string value a placeholder becomes the member's text, JSON-escaped.
// Object member names are never substituted.
var placeholders = []string{"{{code}}", "{{status}}", "{{title}}", "{{detail}}", "{{type}}"}

// stripeBody is Stripe's error envelope: the members stripe-go reads into
// *stripe.Error.
type stripeBody struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		DocURL  string `json:"doc_url,omitempty"`
	} `json:"error"`
}

// stripeEnvelope renders p as Stripe's error object.
func stripeEnvelope(p idemhttp.Problem) (string, []byte) {
	var b stripeBody
	b.Error.Code, b.Error.Message, b.Error.DocURL = p.ErrorCode, p.Detail, p.Type
	switch {
	case p.ErrorCode == idem.ECodeInProgress || strings.HasPrefix(p.ErrorCode, "IDEMPOTENCY_KEY_"):
		b.Error.Type = "idempotency_error"
	case p.Status >= 400 && p.Status < 500:
		b.Error.Type = "invalid_request_error"
	default:
		b.Error.Type = "api_error"
	}
	out, err := json.Marshal(b)
	if err != nil {
		return idemhttp.ProblemContentType, problemJSON(p)
	}
	return "application/json", out
}

// problemJSON is p as problem+json: what an envelope falls back to.
func problemJSON(p idemhttp.Problem) []byte {
	b, err := json.Marshal(p)
	if err != nil {
		return []byte(`{"errorCode":"INTERNAL","message":"Internal error."}`)
	}
	return b
}

// envelopeTemplate is a JSON template of an error answer (application/json).
type envelopeTemplate []byte

// loadEnvelope returns the envelope of rt's ErrorEnvelope or
// ErrorEnvelopeFile; nil is problem+json.
func loadEnvelope(rt Route) (idemhttp.Envelope, error) {
	if rt.ErrorEnvelopeFile != "" {
		f, err := os.Open(rt.ErrorEnvelopeFile)
		if err != nil {
			return nil, fmt.Errorf("error-envelope-file: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, MaxEnvelopeFile+1))
		if err != nil {
			return nil, fmt.Errorf("error-envelope-file: %w", err)
		}
		if len(b) > MaxEnvelopeFile {
			return nil, fmt.Errorf("error-envelope-file %s: larger than %d bytes", rt.ErrorEnvelopeFile, MaxEnvelopeFile)
		}
		t, err := ParseEnvelopeTemplate(b)
		if err != nil {
			return nil, fmt.Errorf("error-envelope-file %s: %w", rt.ErrorEnvelopeFile, err)
		}
		return t, nil
	}
	switch rt.ErrorEnvelope {
	case "", EnvelopeProblem:
		return nil, nil
	case EnvelopeStripe:
		return stripeEnvelope, nil
	}
	return nil, fmt.Errorf("error-envelope %q: want %s or %s", rt.ErrorEnvelope, EnvelopeProblem, EnvelopeStripe)
}

// ParseEnvelopeTemplate checks a JSON error envelope template (see
// Route.ErrorEnvelopeFile) and returns the Envelope that renders it: a
// JSON object, without duplicate names, whose string values may hold the
// placeholders {{code}}, {{status}}, {{title}}, {{detail}} and {{type}},
// and which holds {{code}} at least once (the errorCode keeps its
// meaning). Answers rendered by it are application/json.
func ParseEnvelopeTemplate(b []byte) (idemhttp.Envelope, error) {
	if len(b) > MaxEnvelopeFile {
		return nil, fmt.Errorf("sidecar: envelope template larger than %d bytes", MaxEnvelopeFile)
	}
	t := envelopeTemplate(bytes.Clone(b))
	var probe idemhttp.Problem
	out, hasCode, err := t.render(probe, true)
	if err != nil {
		return nil, fmt.Errorf("sidecar: envelope template: %w", err)
	}
	if !hasCode {
		return nil, errors.New(`sidecar: envelope template: want "{{code}}" in a string value, so that the errorCode is kept`)
	}
	if len(out) == 0 || out[0] != '{' {
		return nil, errors.New("sidecar: envelope template: want a JSON object")
	}
	return func(p idemhttp.Problem) (string, []byte) {
		out, _, err := t.render(p, false)
		if err != nil {
			// Not reached: the template was rendered once when parsed.
			return idemhttp.ProblemContentType, problemJSON(p)
		}
		return "application/json", out
	}, nil
}

// render writes t with p's members in place of the placeholders, and
// reports whether {{code}} was used. strict refuses what looks like a
// placeholder but is none (a typo such as {{detials}}).
func (t envelopeTemplate) render(p idemhttp.Problem, strict bool) ([]byte, bool, error) {
	status := strconv.Itoa(p.Status)
	r := strings.NewReplacer("{{code}}", p.ErrorCode, "{{status}}", status, "{{title}}", p.Title,
		"{{detail}}", p.Detail, "{{type}}", p.Type)
	dec := jsontext.NewDecoder(bytes.NewReader(t))
	var out bytes.Buffer
	enc := jsontext.NewEncoder(&out)
	hasCode := false
	for {
		kind, n := dec.StackIndex(dec.StackDepth())
		name := kind == '{' && n%2 == 0
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, false, err
		}
		if tok.Kind() == '"' && !name {
			s := tok.String()
			if strict {
				if err := checkPlaceholders(s); err != nil {
					return nil, false, err
				}
			}
			hasCode = hasCode || strings.Contains(s, "{{code}}")
			switch {
			case s == "{{status}}":
				tok = jsontext.Int(int64(p.Status))
			case strings.Contains(s, "{{"):
				// The problem's text is the node's own, valid UTF-8;
				// ToValidUTF8 keeps the JSON valid whatever it holds.
				tok = jsontext.String(strings.ToValidUTF8(r.Replace(s), "\uFFFD"))
			}
		}
		if err := enc.WriteToken(tok); err != nil {
			return nil, false, err
		}
		if dec.StackDepth() == 0 {
			// One value, and nothing after it.
			if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
				return nil, false, errors.New("want one JSON value")
			}
			break
		}
	}
	return bytes.TrimSpace(out.Bytes()), hasCode, nil
}

// checkPlaceholders refuses a "{{...}}" in s that is not a placeholder.
func checkPlaceholders(s string) error {
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			return nil
		}
		s = s[i:]
		known := false
		for _, ph := range placeholders {
			if strings.HasPrefix(s, ph) {
				s, known = s[len(ph):], true
				break
			}
		}
		if !known {
			return errors.New("a placeholder other than {{code}}, {{status}}, {{title}}, {{detail}} and {{type}}")
		}
	}
}

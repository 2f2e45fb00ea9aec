package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

// TestEnvelope: an Envelope renders the body and its Content-Type; the
// status, Retry-After and the code stay the table's, the type URI goes in
// a Link header, and the tables derived from one keep its envelope.
func TestEnvelope(t *testing.T) {
	var got idemhttp.Problem
	env := func(p idemhttp.Problem) (string, []byte) {
		got = p
		b, _ := json.Marshal(map[string]any{"fault": map[string]any{"id": p.ErrorCode, "http": p.Status}})
		return "application/vnd.example+json", b
	}
	base := idemhttp.DefaultErrors().WithEnvelope(env)
	extended, err := base.With(map[string]idemhttp.ErrorClass{"WIDGET_JAMMED": {Status: http.StatusConflict, Title: "Widget jammed"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, table := range map[string]*idemhttp.Errors{
		"WithEnvelope": base,
		"With":         extended,
		"WithStatus":   base.WithStatus(idem.ECodeOutcomeUnknown, idemhttp.ErrorClass{Status: 503, RetryAfter: 1, Title: "Outcome not known yet"}),
	} {
		rec := httptest.NewRecorder()
		table.Write(rec, httptest.NewRequest(http.MethodPost, "/x", nil), nil, idem.Errorf(idem.ECodeInProgress, "Still running."))
		if rec.Code != http.StatusConflict || rec.Header().Get("Retry-After") != "1" || rec.Header().Get("Content-Type") != "application/vnd.example+json" {
			t.Errorf("%s: %d, headers %v, want 409 with Retry-After 1 in the envelope's type", name, rec.Code, rec.Header())
		}
		if want := `{"fault":{"http":409,"id":"IDEMPOTENCY_REQUEST_IN_PROGRESS"}}`; rec.Body.String() != want {
			t.Errorf("%s: body %s, want %s", name, rec.Body, want)
		}
		if link := rec.Header().Get("Link"); link != "<"+table.TypeURI(idem.ECodeInProgress)+`>; rel="type"` {
			t.Errorf("%s: Link %q, want the type URI", name, link)
		}
		if got.Detail != "Still running." || got.Title == "" || got.Type != table.TypeURI(idem.ECodeInProgress) {
			t.Errorf("%s: the envelope got %+v, want every member of the problem", name, got)
		}
	}
	// nil renders problem+json again, without a Link.
	status, h, b := base.WithEnvelope(nil).Render(idem.ECodeKeyReused, "Reused.")
	var p idemhttp.Problem
	if err := json.Unmarshal(b, &p); err != nil || status != 409 || h.Get("Content-Type") != idemhttp.ProblemContentType || h.Get("Link") != "" || p.ErrorCode != idem.ECodeKeyReused {
		t.Errorf("without an envelope: %d %v %s (%v), want a 409 problem", status, h, b, err)
	}
}

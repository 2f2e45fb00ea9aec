package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

func decodeProblem(t *testing.T, rec *httptest.ResponseRecorder) idemhttp.Problem {
	t.Helper()
	var p idemhttp.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != idemhttp.ProblemContentType {
		t.Errorf("Content-Type %q, want %s", ct, idemhttp.ProblemContentType)
	}
	if p.Status != rec.Code || p.Detail != p.Message || p.Title == "" || p.Type != idemhttp.DefaultTypeBase+lower(p.ErrorCode) {
		t.Errorf("problem %+v for status %d", p, rec.Code)
	}
	return p
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// TestErrorsWrite: the table answers a code with its status, Retry-After
// and a problem body; internal details and unknown codes never reach the
// client; a cancelled request is UNAVAILABLE; REQUEST_TIMEOUT closes the
// connection.
func TestErrorsWrite(t *testing.T) {
	table := idemhttp.DefaultErrors()
	req := httptest.NewRequest(http.MethodPost, "/x", nil)
	for _, c := range []struct {
		err        error
		status     int
		code, msg  string
		retryAfter string
	}{
		{idem.Errorf(idem.ECodeKeyReused, "Reused."), 409, idem.ECodeKeyReused, "Reused.", ""},
		{idem.Errorf(idem.ECodeInProgress, "Busy."), 409, idem.ECodeInProgress, "Busy.", "1"},
		{idem.Errorf(idem.ECodeOutcomeUnknown, "Unknown."), 202, idem.ECodeOutcomeUnknown, "Unknown.", "1"},
		{&idem.Error{Code: idem.ECodeInternal, Message: "secret detail", Err: errors.New("db password")}, 500, idem.ECodeInternal, "Internal error.", ""},
		{errors.New("plain"), 500, idem.ECodeInternal, "Internal error.", ""},
		{idem.Errorf("NO_SUCH_CODE", "Made up."), 500, idem.ECodeInternal, "Internal error.", ""},
	} {
		rec := httptest.NewRecorder()
		table.Write(rec, req, nil, c.err)
		p := decodeProblem(t, rec)
		if rec.Code != c.status || p.ErrorCode != c.code || p.Message != c.msg || rec.Header().Get("Retry-After") != c.retryAfter {
			t.Errorf("%v: %d %+v Retry-After %q; want %d %s %q Retry-After %q", c.err, rec.Code, p, rec.Header().Get("Retry-After"), c.status, c.code, c.msg, c.retryAfter)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	table.Write(rec, req.WithContext(ctx), nil, ctx.Err())
	if p := decodeProblem(t, rec); rec.Code != 503 || p.ErrorCode != idem.ECodeUnavailable {
		t.Errorf("cancelled: %d %+v", rec.Code, p)
	}
	rec = httptest.NewRecorder()
	table.Write(rec, req, nil, idem.Errorf(idem.ECodeRequestTimeout, "Slow body."))
	if rec.Code != 408 || rec.Header().Get("Connection") != "close" {
		t.Errorf("request timeout: %d %v", rec.Code, rec.Header())
	}
}

// TestErrorsWith: an operation adds codes of its own; it may repeat a code
// only as it already answers, and a malformed declaration is refused.
func TestErrorsWith(t *testing.T) {
	base := idemhttp.DefaultErrors()
	ext, err := base.With(map[string]idemhttp.ErrorClass{"ORDER_CLOSED": {Status: 409, Title: "Order closed"}})
	if err != nil {
		t.Fatal(err)
	}
	if ext.Status("ORDER_CLOSED") != 409 || base.Status("ORDER_CLOSED") != 500 {
		t.Errorf("With changed the base, or did not add: %d, %d", ext.Status("ORDER_CLOSED"), base.Status("ORDER_CLOSED"))
	}
	if _, err := ext.With(map[string]idemhttp.ErrorClass{idem.ECodeKeyReused: base.Class(idem.ECodeKeyReused)}); err != nil {
		t.Errorf("repeating a code as it answers: %v", err)
	}
	for name, codes := range map[string]map[string]idemhttp.ErrorClass{
		"changes an engine code": {idem.ECodeKeyReused: {Status: 400, Title: "x"}},
		"lower case":             {"order_closed": {Status: 409, Title: "x"}},
		"no title":               {"ORDER_OPEN": {Status: 409}},
		"bad status":             {"ORDER_OPEN": {Status: 99, Title: "x"}},
		"negative Retry-After":   {"ORDER_OPEN": {Status: 503, RetryAfter: -1, Title: "x"}},
	} {
		if _, err := base.With(codes); err == nil {
			t.Errorf("With accepted a declaration that %s", name)
		}
	}
	pending := base.WithStatus(idem.ECodeOutcomeUnknown, idemhttp.ErrorClass{Status: 503, RetryAfter: 1, Title: "Outcome not known yet"})
	if pending.Status(idem.ECodeOutcomeUnknown) != 503 || base.Status(idem.ECodeOutcomeUnknown) != 202 || pending.Status("NO_SUCH_CODE") != 500 {
		t.Errorf("WithStatus: %d in the copy, %d in the base, %d for an unknown code", pending.Status(idem.ECodeOutcomeUnknown),
			base.Status(idem.ECodeOutcomeUnknown), pending.Status("NO_SUCH_CODE"))
	}
}

package httpanswer_test

import (
	"maps"
	"net/http"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/httpanswer"
)

func TestDefaultClass(t *testing.T) {
	for _, c := range []struct {
		status int
		want   idem.Status
	}{
		{100, idem.StatusCompleted}, {200, idem.StatusCompleted}, {201, idem.StatusCompleted}, {204, idem.StatusCompleted},
		{302, idem.StatusCompleted}, {399, idem.StatusCompleted},
		{400, idem.StatusFailedReplayable}, {402, idem.StatusFailedReplayable}, {404, idem.StatusFailedReplayable},
		{422, idem.StatusFailedReplayable}, {499, idem.StatusFailedReplayable},
		{408, idem.StatusFailedRetryable}, {409, idem.StatusFailedRetryable}, {425, idem.StatusFailedRetryable},
		{429, idem.StatusFailedRetryable}, {500, idem.StatusFailedRetryable}, {503, idem.StatusFailedRetryable},
		{599, idem.StatusFailedRetryable},
	} {
		if got := httpanswer.DefaultClass(c.status); got != c.want {
			t.Errorf("DefaultClass(%d) = %s, want %s", c.status, got, c.want)
		}
	}
}

func TestResult(t *testing.T) {
	header := http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/a/1", "/a/2"},
		"X-Empty":      {""},
		"Set-Cookie":   {"s=1"},
		"X-Request-Id": {"req-1"},
	}
	body := []byte(`{"id":1}`)
	for _, c := range []struct {
		name   string
		a      httpanswer.Answer
		stored []string
		// want
		status  int
		class   idem.Status
		headers map[string]string
		body    string
		schema  string
		code    string
	}{
		{name: "created", a: httpanswer.Answer{Status: 201, Header: header, Body: body}, stored: httpanswer.DefaultReplayHeaders(),
			status: 201, class: idem.StatusCompleted, headers: map[string]string{"Content-Type": "application/json", "Location": "/a/1"}, body: string(body)},
		{name: "nothing written", a: httpanswer.Answer{},
			status: 200, class: idem.StatusCompleted, headers: map[string]string{}},
		{name: "names canonicalised", a: httpanswer.Answer{Status: 200, Header: header}, stored: []string{"x-request-id", "CONTENT-TYPE", "x-empty", "x-absent"},
			status: 200, class: idem.StatusCompleted, headers: map[string]string{"X-Request-Id": "req-1", "Content-Type": "application/json"}},
		{name: "set-cookie named", a: httpanswer.Answer{Status: 200, Header: header}, stored: []string{"Set-Cookie"},
			status: 200, class: idem.StatusCompleted, headers: map[string]string{"Set-Cookie": "s=1"}},
		{name: "replayable", a: httpanswer.Answer{Status: 402, Body: body},
			status: 402, class: idem.StatusFailedReplayable, headers: map[string]string{}, body: string(body), code: "HTTP_402"},
		{name: "retryable", a: httpanswer.Answer{Status: 503, Body: body},
			status: 503, class: idem.StatusFailedRetryable, headers: map[string]string{}, body: string(body), code: "HTTP_503"},
		{name: "classified retryable", a: httpanswer.Answer{Status: 200, Class: idem.StatusFailedRetryable},
			status: 200, class: idem.StatusFailedRetryable, headers: map[string]string{}, code: "HTTP_200"},
		{name: "classified unknown", a: httpanswer.Answer{Status: 500, Class: idem.StatusUnknown},
			status: 500, class: idem.StatusUnknown, headers: map[string]string{}},
		{name: "classified completed", a: httpanswer.Answer{Status: 500, Class: idem.StatusCompleted},
			status: 500, class: idem.StatusCompleted, headers: map[string]string{}},
		{name: "not stored", a: httpanswer.Answer{Status: 201, Header: header, Body: body, NotStored: true}, stored: []string{"Location"},
			status: 201, class: idem.StatusCompleted, headers: map[string]string{"Location": "/a/1"}, schema: httpanswer.NotStoredSchema},
		{name: "not stored, replayable", a: httpanswer.Answer{Status: 404, NotStored: true},
			status: 404, class: idem.StatusFailedReplayable, headers: map[string]string{}, schema: httpanswer.NotStoredSchema, code: "HTTP_404"},
	} {
		res := c.a.Result(c.stored)
		r := res.Response
		if r.Status != c.status || res.Status != c.class || !maps.Equal(r.Headers, c.headers) || r.Headers == nil ||
			string(r.Body) != c.body || r.Body == nil || r.SchemaVersion != c.schema || res.ErrorCode != c.code || res.Stored {
			t.Errorf("%s: Result = %+v, want %d %s %v %q %q %q", c.name, res, c.status, c.class, c.headers, c.body, c.schema, c.code)
		}
	}
}

func TestErrorCode(t *testing.T) {
	if got := httpanswer.ErrorCode(402); got != "HTTP_402" {
		t.Errorf("ErrorCode(402) = %q, want HTTP_402", got)
	}
}

func TestDefaultReplayHeadersAreFresh(t *testing.T) {
	a := httpanswer.DefaultReplayHeaders()
	a[0] = "X-Changed"
	if b := httpanswer.DefaultReplayHeaders(); b[0] != "Content-Type" || len(b) != 3 {
		t.Errorf("DefaultReplayHeaders() = %q after a caller changed its copy", b)
	}
}

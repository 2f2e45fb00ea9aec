// Package httpanswer is how an HTTP answer becomes a record's result, the
// one classification the middleware (package idemhttp, for a handler's
// answer) and the sidecar (for an upstream's, and for what its recovery
// learns) share, so that both store and replay an answer alike:
//
//   - its class ([DefaultClass] of its status, unless the caller says),
//   - which of its headers are kept and replayed (those the caller names,
//     under their canonical names; [DefaultReplayHeaders]),
//   - the marker of an answer kept without its body ([NotStoredSchema]),
//   - the error code of a failed answer's record ([ErrorCode]).
package httpanswer

import (
	"net/http"
	"strconv"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// NotStoredSchema is the Response.SchemaVersion of an answer recorded
// without its body (idemhttp.NotStoredSchema): its record is settled, and
// a retry answers 410 IDEMPOTENCY_RESPONSE_NOT_STORED instead of a replay.
const NotStoredSchema = "not-stored"

// DefaultReplayHeaders returns the answer headers kept and replayed when
// the caller adds none: Content-Type, Content-Encoding (the stored body is
// the bytes as written, so their encoding goes with them) and Location.
func DefaultReplayHeaders() []string {
	return []string{"Content-Type", "Content-Encoding", "Location"}
}

// DefaultClass is how an answer of status is stored when nothing else
// decides: 1xx-3xx COMPLETED; 408, 409, 425, 429 and 5xx FAILED_RETRYABLE
// (not stored: the next retry executes again); other 4xx
// FAILED_REPLAYABLE.
func DefaultClass(status int) idem.Status {
	switch {
	case status < 400:
		return idem.StatusCompleted
	case status == http.StatusRequestTimeout, status == http.StatusConflict, status == http.StatusTooEarly,
		status == http.StatusTooManyRequests, status >= 500:
		return idem.StatusFailedRetryable
	}
	return idem.StatusFailedReplayable
}

// ErrorCode is the error code the record of a failed answer of status
// carries: HTTP_<status> (HTTP_402).
func ErrorCode(status int) string {
	return "HTTP_" + strconv.Itoa(status)
}

// Answer is an HTTP answer to record.
type Answer struct {
	// Status is the answer's status; 0 is 200 OK (a handler that wrote
	// nothing).
	Status int
	// Header is the answer's header; only the names Result is given are
	// kept.
	Header http.Header
	// Body is the answer's body as written.
	Body []byte
	// Class is how the answer is stored; "" is DefaultClass(Status).
	Class idem.Status
	// NotStored says that the body is not kept (it went to the client as
	// it was written, or it is larger than may be stored): the record
	// keeps the status and headers, marked NotStoredSchema.
	NotStored bool
}

// Result is the engine.Result that records a, keeping the headers named
// in stored:
//
//   - Response: the status; of each header named, its first value when it
//     has a non-empty one, under its canonical name (Set-Cookie only when
//     named); the body, empty rather than nil, or none and SchemaVersion
//     NotStoredSchema when NotStored.
//   - Status: the class.
//   - ErrorCode: ErrorCode(status) for FAILED_REPLAYABLE and
//     FAILED_RETRYABLE; none for COMPLETED, and none for
//     UNKNOWN_REQUIRES_RECOVERY, whose record the engine gives the
//     operation's code for an unknown outcome (engine.Operation.UnknownCode).
func (a Answer) Result(stored []string) engine.Result {
	status := a.Status
	if status == 0 {
		status = http.StatusOK
	}
	class := a.Class
	if class == "" {
		class = DefaultClass(status)
	}
	headers := make(map[string]string, len(stored))
	for _, name := range stored {
		if v := a.Header.Get(name); v != "" {
			headers[http.CanonicalHeaderKey(name)] = v
		}
	}
	res := engine.Result{Response: idem.Response{Status: status, Headers: headers, Body: a.Body}, Status: class}
	if res.Response.Body == nil || a.NotStored {
		res.Response.Body = []byte{}
	}
	if a.NotStored {
		res.Response.SchemaVersion = NotStoredSchema
	}
	if class == idem.StatusFailedReplayable || class == idem.StatusFailedRetryable {
		res.ErrorCode = ErrorCode(status)
	}
	return res
}

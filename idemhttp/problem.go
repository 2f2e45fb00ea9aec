package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/idemcoord/idem"
)

// ProblemContentType is the media type of every error answer (RFC 9457).
const ProblemContentType = "application/problem+json"

// DefaultTypeBase is where the type URI of an error code points by
// default: the code's section of the project's error documentation
// (docs/errors.md), whose heading ids are the codes in lower case.
const DefaultTypeBase = "https://github.com/idemcoord/idem/blob/main/docs/errors.md#"

// ErrorClass is how an error code answers over HTTP.
type ErrorClass struct {
	// Status is the HTTP status.
	Status int
	// RetryAfter, when above zero, is sent as Retry-After (seconds): the
	// same request, with the same key, may succeed then.
	RetryAfter int
	// Title is a short, fixed summary of the problem type (RFC 9457
	// "title"); the message says what happened to this request.
	Title string
}

// Problem is an error answer's body: RFC 9457's members, plus errorCode and
// message, which clients of earlier versions read.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	ErrorCode string `json:"errorCode"`
	Message   string `json:"message"`
}

// Errors is the one table of error codes: for each code, its status,
// Retry-After and title. Every surface answers its errors through one
// (the middleware, the node, the sidecar, the coordination API), so a code
// answers the same everywhere. The zero value is not usable: start from
// DefaultErrors and add an operation's own codes with With.
type Errors struct {
	classes  map[string]ErrorClass
	envelope Envelope
}

// Envelope renders an error answer's body in the shape a surface's clients
// parse errors from, when that is not problem+json: an SDK of the API a
// sidecar route stands in front of reads only that API's own error object.
// It returns the body and its Content-Type. The status and Retry-After stay
// the table's, and every member of p (its code, its type URI) keeps its
// meaning; the type URI is also sent as a Link header (rel="type", RFC
// 9457's member as a link), whatever the envelope holds.
type Envelope func(p Problem) (contentType string, body []byte)

// defaultClasses are the codes of the engine, the middleware and the node
// (package idem's codes).
var defaultClasses = map[string]ErrorClass{
	idem.ECodeKeyMissing:                 {http.StatusBadRequest, 0, "Idempotency key missing"},
	idem.ECodeKeyInvalid:                 {http.StatusBadRequest, 0, "Idempotency key invalid"},
	idem.ECodeKeyReused:                  {http.StatusConflict, 0, "Idempotency key reused with a different request"},
	idem.ECodeInProgress:                 {http.StatusConflict, 1, "Request with this idempotency key in progress"},
	idem.ECodeRecordNotFound:             {http.StatusNotFound, 0, "Idempotency record not found"},
	idem.ECodeFencingTokenStale:          {http.StatusConflict, 0, "Fencing token stale"},
	idem.ECodeOutcomeUnknown:             {http.StatusAccepted, 1, "Outcome not known yet"},
	idem.ECodeRoutingLoop:                {http.StatusLoopDetected, 0, "Routing loop"},
	idem.ECodeNotHome:                    {http.StatusServiceUnavailable, 1, "Tenant not served here"},
	idem.ECodeReconciliationPending:      {http.StatusServiceUnavailable, 1, "Reconciliation pending"},
	idem.ECodeUnauthenticated:            {http.StatusUnauthorized, 0, "Unauthenticated"},
	idem.ECodeForwardingNotAuthenticated: {http.StatusForbidden, 0, "Forwarding not authenticated"},
	idem.ECodeRequestMalformed:           {http.StatusUnprocessableEntity, 0, "Request malformed"},
	idem.ECodeValidationFailed:           {http.StatusUnprocessableEntity, 0, "Request validation failed"},
	idem.ECodeBodyTooLarge:               {http.StatusRequestEntityTooLarge, 0, "Request body too large"},
	idem.ECodePathInvalid:                {http.StatusBadRequest, 0, "Request path invalid"},
	idem.ECodeUnsupportedMediaType:       {http.StatusUnsupportedMediaType, 0, "Unsupported media type"},
	idem.ECodeAPIVersionUnsupported:      {http.StatusBadRequest, 0, "API version unsupported"},
	idem.ECodeNotFound:                   {http.StatusNotFound, 0, "Not found"},
	idem.ECodeMethodNotAllowed:           {http.StatusMethodNotAllowed, 0, "Method not allowed"},
	idem.ECodeOperationUnknown:           {http.StatusNotFound, 0, "Operation unknown"},
	idem.ECodeRequestTimeout:             {http.StatusRequestTimeout, 0, "Request timeout"},
	idem.ECodeResponseTooLarge:           {http.StatusInternalServerError, 0, "Response too large to store"},
	idem.ECodeResponseNotStored:          {http.StatusGone, 0, "Response not stored"},
	idem.ECodeRecordNotStuck:             {http.StatusConflict, 0, "Idempotency record not stuck"},
	idem.ECodeWebhookSignatureInvalid:    {http.StatusUnauthorized, 0, "Webhook signature invalid"},
	idem.ECodeStoreUnavailable:           {http.StatusServiceUnavailable, 1, "Store unavailable"},
	idem.ECodeUnavailable:                {http.StatusServiceUnavailable, 1, "Service unavailable"},
	idem.ECodeInternal:                   {http.StatusInternalServerError, 0, "Internal error"},
}

// DefaultErrors returns the table of package idem's codes, with type URIs
// under DefaultTypeBase.
func DefaultErrors() *Errors {
	return &Errors{classes: maps.Clone(defaultClasses)}
}

// With returns a copy of t that also answers an operation's own codes.
// A code already in t may be given again only with the same class, so that
// no operation changes how another's (or the engine's) codes answer.
func (t *Errors) With(codes map[string]ErrorClass) (*Errors, error) {
	out := &Errors{classes: maps.Clone(t.classes), envelope: t.envelope}
	for _, code := range slices.Sorted(maps.Keys(codes)) {
		c := codes[code]
		if !validCode(code) || c.Status < 200 || c.Status > 599 || c.RetryAfter < 0 || c.Title == "" {
			return nil, fmt.Errorf("idemhttp: error code %q: want UPPER_SNAKE_CASE, a status from 200 to 599, a title and RetryAfter >= 0", code)
		}
		if old, ok := out.classes[code]; ok && old != c {
			return nil, fmt.Errorf("idemhttp: error code %q is already answered as %d %q", code, old.Status, old.Title)
		}
		out.classes[code] = c
	}
	return out, nil
}

// WithStatus returns a copy of t in which code answers as c: for one
// surface whose clients need an existing code answered otherwise (a
// sidecar route in front of an SDK that takes any status below 400 for
// success answers OUTCOME_UNKNOWN as a retryable 503). Unlike With, it may
// change a code's class; it never adds one.
func (t *Errors) WithStatus(code string, c ErrorClass) *Errors {
	out := &Errors{classes: maps.Clone(t.classes), envelope: t.envelope}
	if _, ok := out.classes[code]; ok {
		out.classes[code] = c
	}
	return out
}

// WithEnvelope returns a copy of t whose answers are rendered by env
// instead of as problem+json; nil renders problem+json again.
func (t *Errors) WithEnvelope(env Envelope) *Errors {
	return &Errors{classes: t.classes, envelope: env}
}

func validCode(code string) bool {
	if code == "" || len(code) > 64 {
		return false
	}
	for i := 0; i < len(code); i++ {
		if c := code[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Codes lists the table's codes, sorted.
func (t *Errors) Codes() []string { return slices.Sorted(maps.Keys(t.classes)) }

// Class returns how code answers; a code not in the table answers as
// INTERNAL.
func (t *Errors) Class(code string) ErrorClass {
	if c, ok := t.classes[code]; ok {
		return c
	}
	return t.classes[idem.ECodeInternal]
}

// Status returns the HTTP status of code (500 for a code not in the table).
func (t *Errors) Status(code string) int { return t.Class(code).Status }

// TypeURI returns the type URI of code: where its documentation is.
func (t *Errors) TypeURI(code string) string {
	if _, ok := t.classes[code]; !ok {
		code = idem.ECodeInternal
	}
	return DefaultTypeBase + strings.ToLower(code)
}

// Problem returns the answer of code with message, and the headers it
// goes with (Content-Type, and Retry-After where the class has one). A
// code not in the table answers INTERNAL.
func (t *Errors) Problem(code, message string) (Problem, http.Header) {
	if _, ok := t.classes[code]; !ok {
		code, message = idem.ECodeInternal, "Internal error."
	}
	c := t.classes[code]
	h := http.Header{"Content-Type": {ProblemContentType}}
	if c.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(c.RetryAfter))
	}
	return Problem{Type: t.TypeURI(code), Title: c.Title, Status: c.Status, Detail: message, ErrorCode: code, Message: message}, h
}

// Render returns the status, headers and body of the answer of code with
// message: what Write sends, for an answer that is stored and replayed.
// With an Envelope, the body and Content-Type are the envelope's.
func (t *Errors) Render(code, message string) (int, http.Header, []byte) {
	p, h := t.Problem(code, message)
	if t.envelope != nil {
		ct, b := t.envelope(p)
		h.Set("Content-Type", ct)
		h.Set("Link", "<"+p.Type+`>; rel="type"`)
		return p.Status, h, b
	}
	b, err := json.Marshal(p)
	if err != nil {
		b = []byte(`{"errorCode":"INTERNAL","message":"Internal error."}`)
	}
	return p.Status, h, b
}

// Write answers err: its code's status, Retry-After and problem body. The
// message is the one the error carries for clients (idem.ErrorMessage);
// INTERNAL always says "Internal error.", and internal details are logged
// (for statuses of 500 and above), never sent. An error that is the
// request's own cancellation (the client went away) answers UNAVAILABLE,
// logged at debug: nobody reads it, and the retry with the same key gets
// the real answer. REQUEST_TIMEOUT closes the connection (the rest of the
// body may still be on its way). logger may be nil.
func (t *Errors) Write(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	code := idem.ErrorCode(err)
	msg := idem.ErrorMessage(err)
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		logger.DebugContext(r.Context(), "client went away", "method", r.Method, "path", r.URL.Path, "err", err)
		code, msg = idem.ECodeUnavailable, "The request was cancelled; retry with the same key."
	} else if t.Status(code) >= 500 {
		logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	}
	if _, ok := t.classes[code]; !ok || code == idem.ECodeInternal {
		code, msg = idem.ECodeInternal, "Internal error."
	}
	if code == idem.ECodeRequestTimeout {
		w.Header().Set("Connection", "close")
	}
	status, h, body := t.Render(code, msg)
	for k, v := range h {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

package region

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/strictjson"
	"github.com/idemcoord/idem/payments"
)

// The coordination API exposes the idem.Coordinator contract over HTTP, for
// services that are not written in Go (package coordclient is the Go client).
// The tenant always comes from the bearer token; {operation} and {key} are
// path segments (percent-encode "/" as %2F, and a key of "." or ".." as %2E).
//
//	POST /v1/coordination/{operation}/{key}/begin       -> 200 {"outcome",...}
//	POST /v1/coordination/{operation}/{key}/checkpoint  -> 204
//	POST /v1/coordination/{operation}/{key}/complete    -> 204
//	POST /v1/coordination/{operation}/{key}/fail        -> 204
//	GET  /v1/coordination/{operation}/{key}             -> 200 {"record","response"}
//
// docs/coordination-openapi.yaml describes the bodies.

// Limits of the coordination API.
const (
	maxOperationLen     = 64
	maxOwnerLen         = 128 // characters
	maxRequestHashLen   = 256
	maxCheckpointLen    = 64
	maxErrorCodeLen     = 128
	maxResourceTypeLen  = 64
	maxResourceIDLen    = 255
	maxSchemaVersionLen = 32
	maxStoredHeaders    = 64
	maxHeaderNameLen    = 256
	maxHeaderValueLen   = 8 << 10

	defaultLockTimeout = 30 * time.Second
	maxLockTimeout     = time.Hour
	maxWindow          = 30 * 24 * time.Hour
)

const coordPrefix = "/v1/coordination/{operation}/{key}"

func (s *Server) registerCoordination(mux *http.ServeMux) {
	mux.HandleFunc("POST "+coordPrefix+"/begin", s.authenticated(s.handleCoordBegin))
	mux.HandleFunc("POST "+coordPrefix+"/checkpoint", s.authenticated(s.handleCoordCheckpoint))
	mux.HandleFunc("POST "+coordPrefix+"/complete", s.authenticated(s.handleCoordComplete))
	mux.HandleFunc("POST "+coordPrefix+"/fail", s.authenticated(s.handleCoordFail))
	mux.HandleFunc("GET "+coordPrefix, s.authenticated(s.handleCoordGet))
	for p, allow := range map[string]string{
		coordPrefix + "/begin":      http.MethodPost,
		coordPrefix + "/checkpoint": http.MethodPost,
		coordPrefix + "/complete":   http.MethodPost,
		coordPrefix + "/fail":       http.MethodPost,
		coordPrefix:                 "GET, HEAD",
	} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeMethodNotAllowed, "The method is not allowed here."))
		})
	}
}

// --- wire types ---

// coordResponse is a stored response on the wire; Body is base64 (standard
// alphabet, padded), as encoding/json writes []byte.
type coordResponse struct {
	Status        int               `json:"status"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion"`
}

func coordResponseOf(r *idem.Response) *coordResponse {
	if r == nil {
		return nil
	}
	out := &coordResponse{Status: r.Status, Headers: r.Headers, Body: r.Body, SchemaVersion: r.SchemaVersion}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	return out
}

type beginInput struct {
	RequestHash        *string        `json:"requestHash"`
	Command            jsontext.Value `json:"command"`
	LockTimeoutSeconds *int64         `json:"lockTimeoutSeconds"`
	WindowSeconds      *int64         `json:"windowSeconds"`
	Owner              *string        `json:"owner"`
}

type beginOutput struct {
	Outcome string `json:"outcome"`
	// FencingToken is set when the caller now owns the record.
	FencingToken int64          `json:"fencingToken,omitempty"`
	Record       recordView     `json:"record"`
	Response     *coordResponse `json:"response,omitempty"`
	ExpiredRetry bool           `json:"expiredRetry"`
}

type recordOutput struct {
	Record   recordView     `json:"record"`
	Response *coordResponse `json:"response,omitempty"`
}

type responseInput struct {
	Status        *int              `json:"status"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion"`
}

type checkpointInput struct {
	FencingToken *int64  `json:"fencingToken"`
	Checkpoint   *string `json:"checkpoint"`
}

type completeInput struct {
	FencingToken *int64         `json:"fencingToken"`
	Response     *responseInput `json:"response"`
	ResourceType string         `json:"resourceType"`
	ResourceID   string         `json:"resourceId"`
}

type failInput struct {
	FencingToken *int64         `json:"fencingToken"`
	Status       *string        `json:"status"`
	ErrorCode    string         `json:"errorCode"`
	Response     *responseInput `json:"response"`
}

// --- handlers ---

func (s *Server) handleCoordBegin(w http.ResponseWriter, r *http.Request, tenant string) {
	start := time.Now()
	scope, err := s.coordScope(r, tenant)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	d, err := s.coordBegin(w, r, scope)
	s.observeCoordination(scope.Operation, d, err, time.Since(start))
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	out := beginOutput{Outcome: d.Outcome.String(), FencingToken: d.Lease.Token, ExpiredRetry: d.ExpiredRetry}
	if d.Record != nil {
		out.Record = viewOf(d.Record)
		if d.Outcome == idem.OutcomeReplay {
			out.Response = coordResponseOf(d.Record.Response)
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	if d.Outcome == idem.OutcomeInProgress {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) coordBegin(w http.ResponseWriter, r *http.Request, scope idem.Scope) (idem.Decision, error) {
	var in beginInput
	if err := s.decodeCoordBody(w, r, &in); err != nil {
		return idem.Decision{}, err
	}
	req := idem.BeginRequest{
		Scope:      scope,
		Owner:      "coord/" + scope.Tenant,
		HomeRegion: s.cfg.Region,
		LockFor:    defaultLockTimeout,
		Window:     payments.DefaultWindow,
	}
	if s.payments != nil {
		req.Window = s.payments.Window()
	}
	switch {
	case in.RequestHash != nil && len(in.Command) > 0:
		return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Send either requestHash or command, not both.")
	case in.RequestHash != nil:
		version, ok := parseRequestHash(*in.RequestHash)
		if !ok {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed,
				"Field \"requestHash\" must be \"v<version>:<hash>\", at most %d visible ASCII characters.", maxRequestHashLen)
		}
		// A v2 hash also stands for the v1 hash of the same bytes, so a
		// caller's retry after the version change still meets its v1 record.
		req.RequestHashes, req.HashVersion = fingerprint.Equivalent(*in.RequestHash), version
	case len(in.Command) > 0:
		hashes, err := commandHashes(scope.Operation, in.Command)
		if err != nil {
			return idem.Decision{}, err
		}
		req.RequestHashes, req.HashVersion = hashes, fingerprint.Version
	default:
		return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Send requestHash or command.")
	}
	if in.LockTimeoutSeconds != nil {
		if *in.LockTimeoutSeconds < 1 || *in.LockTimeoutSeconds > int64(maxLockTimeout/time.Second) {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"lockTimeoutSeconds\" must be 1 to %d.", int64(maxLockTimeout/time.Second))
		}
		req.LockFor = time.Duration(*in.LockTimeoutSeconds) * time.Second
	}
	if in.WindowSeconds != nil {
		if *in.WindowSeconds < 1 || *in.WindowSeconds > int64(maxWindow/time.Second) {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"windowSeconds\" must be 1 to %d.", int64(maxWindow/time.Second))
		}
		req.Window = time.Duration(*in.WindowSeconds) * time.Second
	}
	if in.Owner != nil && *in.Owner != "" {
		if err := checkText("owner", *in.Owner, maxOwnerLen); err != nil {
			return idem.Decision{}, err
		}
		req.Owner = *in.Owner
	}
	return s.store.Begin(r.Context(), req)
}

func (s *Server) handleCoordCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) {
	var in checkpointInput
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	if err == nil {
		switch {
		case in.Checkpoint == nil || *in.Checkpoint == "":
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"checkpoint\" is required.")
		case len(*in.Checkpoint) > maxCheckpointLen || !visibleASCII(*in.Checkpoint):
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"checkpoint\" must be 1 to %d visible ASCII characters.", maxCheckpointLen)
		default:
			err = s.store.Checkpoint(r.Context(), lease, idem.Checkpoint(*in.Checkpoint))
		}
	}
	s.coordNoContent(w, r, err)
}

func (s *Server) handleCoordComplete(w http.ResponseWriter, r *http.Request, tenant string) {
	var in completeInput
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	if err == nil {
		var resp *idem.Response
		switch {
		case in.Response == nil:
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"response\" is required.")
		default:
			if resp, err = responseFrom(in.Response); err == nil {
				if err = checkText("resourceType", in.ResourceType, maxResourceTypeLen); err == nil {
					err = checkText("resourceId", in.ResourceID, maxResourceIDLen)
				}
			}
		}
		if err == nil {
			err = s.store.Complete(r.Context(), lease, idem.Completion{Response: *resp, ResourceType: in.ResourceType, ResourceID: in.ResourceID})
		}
	}
	s.coordNoContent(w, r, err)
}

func (s *Server) handleCoordFail(w http.ResponseWriter, r *http.Request, tenant string) {
	var in failInput
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	var f idem.Failure
	if err == nil {
		switch {
		case in.Status == nil:
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"status\" is required.")
		case *in.Status != string(idem.StatusFailedReplayable) && *in.Status != string(idem.StatusFailedRetryable) && *in.Status != string(idem.StatusUnknown):
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"status\" must be %s, %s or %s.",
				idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown)
		default:
			f = idem.Failure{Status: idem.Status(*in.Status), ErrorCode: in.ErrorCode}
			err = checkText("errorCode", in.ErrorCode, maxErrorCodeLen)
			if err == nil && in.Response != nil {
				f.Response, err = responseFrom(in.Response)
			}
		}
		if err == nil {
			err = s.store.Fail(r.Context(), lease, f)
		}
		if err == nil && f.Status == idem.StatusUnknown {
			s.metrics.unknownStates.WithLabelValues(lease.Operation).Inc()
		}
	}
	s.coordNoContent(w, r, err)
}

// handleCoordGet shows the caller's own record with its stored response.
// Another tenant's key is indistinguishable from an absent one.
func (s *Server) handleCoordGet(w http.ResponseWriter, r *http.Request, tenant string) {
	scope, err := s.coordScope(r, tenant)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	rec, err := s.store.Get(r.Context(), scope)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, recordOutput{Record: viewOf(rec), Response: coordResponseOf(rec.Response)})
}

// --- helpers ---

// coordScope reads {operation} and {key}: the key must be a valid idempotency
// key (400), the operation 1-64 characters of [a-z0-9_.-] (422), not one the
// node serves itself (422), and one the node declares (Config.Operations;
// 404 OPERATION_UNKNOWN otherwise). The message never echoes the name.
func (s *Server) coordScope(r *http.Request, tenant string) (idem.Scope, error) {
	op, key := r.PathValue("operation"), r.PathValue("key")
	if !idem.ValidKey(key) {
		return idem.Scope{}, idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters.")
	}
	if !validOperation(op) {
		return idem.Scope{}, idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-'.", maxOperationLen)
	}
	if op == payments.Operation {
		// The node's own operations keep their records to themselves: their
		// recovery worker acts on them and their stored bodies are never shown.
		return idem.Scope{}, idem.Errorf(idem.ECodeValidationFailed, "Operation %q is reserved for the node's own API.", op)
	}
	if !s.operations[op] {
		return idem.Scope{}, idem.Errorf(idem.ECodeOperationUnknown, "This node does not serve that operation.")
	}
	return idem.Scope{Tenant: tenant, Operation: op, Key: key}, nil
}

func validOperation(op string) bool {
	if len(op) == 0 || len(op) > maxOperationLen {
		return false
	}
	for i := 0; i < len(op); i++ {
		c := op[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// coordLease validates the scope, decodes the body into in and rebuilds the
// caller's lease from the scope (tenant from the token) and the fencing token
// read by token() after decoding.
func (s *Server) coordLease(w http.ResponseWriter, r *http.Request, tenant string, in any, token func() *int64) (idem.Lease, error) {
	scope, err := s.coordScope(r, tenant)
	if err != nil {
		return idem.Lease{}, err
	}
	if err := s.decodeCoordBody(w, r, in); err != nil {
		return idem.Lease{}, err
	}
	t := token()
	if t == nil || *t < 1 {
		return idem.Lease{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"fencingToken\" must be a positive integer.")
	}
	return idem.Lease{Scope: scope, Token: *t}, nil
}

// decodeCoordBody reads one JSON object of at most MaxBodyBytes into dst
// with package strictjson: exact member names, no duplicates, valid UTF-8,
// bounded depth, nothing after the object, no unknown members.
func (s *Server) decodeCoordBody(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json.")
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	return strictjson.ClientError(strictjson.DecodeObject(body, dst))
}

// commandHashes hashes a begin's "command" under every supported fingerprint
// version, current first. The command is read without a float64 anywhere:
// numbers that a double cannot hold exactly are refused (send them as
// strings), so two commands hash alike only if they are the same JSON value.
func commandHashes(operation string, raw jsontext.Value) ([]string, error) {
	cmd, err := fingerprint.ParseObject(raw)
	switch {
	case errors.Is(err, fingerprint.ErrInexactNumber):
		return nil, &idem.Error{Code: idem.ECodeValidationFailed,
			Message: "Field \"command\" holds a number that an IEEE 754 double cannot hold exactly; send it as a string.", Err: err}
	case err != nil:
		return nil, &idem.Error{Code: idem.ECodeValidationFailed, Message: "Field \"command\" must be a JSON object.", Err: err}
	}
	if _, ok := cmd["operation"]; ok {
		// The operation comes from the path; fingerprint refuses a field of
		// that name rather than letting two documents collide.
		return nil, idem.Errorf(idem.ECodeValidationFailed,
			"Field \"command\" must not have a top-level \"operation\" member: the operation comes from the path.")
	}
	hashes, err := fingerprint.Hashes(operation, cmd)
	if err != nil {
		return nil, &idem.Error{Code: idem.ECodeValidationFailed, Message: "Field \"command\" cannot be canonicalised.", Err: err}
	}
	return hashes, nil
}

// parseRequestHash checks "v<version>:<hash>" and returns the version.
func parseRequestHash(h string) (int, bool) {
	if len(h) > maxRequestHashLen || !visibleASCII(h) || !strings.HasPrefix(h, "v") {
		return 0, false
	}
	ver, rest, ok := strings.Cut(h[1:], ":")
	if !ok || rest == "" || ver == "" || len(ver) > 4 || strings.TrimLeft(ver, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(ver)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

func responseFrom(in *responseInput) (*idem.Response, error) {
	if in.Status == nil || *in.Status < 100 || *in.Status > 599 {
		return nil, idem.Errorf(idem.ECodeValidationFailed, "Field \"response.status\" must be an HTTP status code (100-599).")
	}
	if len(in.Headers) > maxStoredHeaders {
		return nil, idem.Errorf(idem.ECodeValidationFailed, "Field \"response.headers\" holds more than %d headers.", maxStoredHeaders)
	}
	for k, v := range in.Headers {
		if !validHeaderName(k) {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "A response header name is not a valid HTTP field name.")
		}
		if len(v) > maxHeaderValueLen || strings.ContainsAny(v, "\r\n\x00") {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "A response header has an invalid value.")
		}
	}
	if len(in.SchemaVersion) > maxSchemaVersionLen || (in.SchemaVersion != "" && !visibleASCII(in.SchemaVersion)) {
		return nil, idem.Errorf(idem.ECodeValidationFailed, "Field \"response.schemaVersion\" must be at most %d visible ASCII characters.", maxSchemaVersionLen)
	}
	return &idem.Response{Status: *in.Status, Headers: in.Headers, Body: in.Body, SchemaVersion: in.SchemaVersion}, nil
}

// checkText accepts "" or at most maxLen characters that package ident
// accepts (NFC, no control or bidirectional control characters).
func checkText(field, v string, maxLen int) error {
	if utf8.RuneCountInString(v) > maxLen {
		return idem.Errorf(idem.ECodeValidationFailed, "Field %q is longer than %d characters.", field, maxLen)
	}
	switch err := ident.Check(v); {
	case errors.Is(err, ident.ErrNotNFC):
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("Field %q must be in Unicode Normalization Form C.", field), Err: err}
	case err != nil:
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("Field %q holds a control, bidirectional control or invalid character.", field), Err: err}
	}
	return nil
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// validHeaderName reports whether k is an RFC 9110 token.
func validHeaderName(k string) bool {
	if k == "" || len(k) > maxHeaderNameLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func (s *Server) coordFail(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Cache-Control", "no-store")
	writeError(w, r, s.logger, err)
}

func (s *Server) coordNoContent(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// observeCoordination counts a begin like an idempotent payment request.
// Only begins of a declared operation (Config.Operations) get here, so no
// label value comes from a request.
func (s *Server) observeCoordination(operation string, d idem.Decision, err error, elapsed time.Duration) {
	outcome := outcomeRejected
	if err == nil {
		outcome = outcomeLabel(d.Outcome)
		switch d.Outcome {
		case idem.OutcomeReplay:
			s.metrics.replays.WithLabelValues(operation).Inc()
		case idem.OutcomeConflict:
			s.metrics.conflicts.WithLabelValues(operation).Inc()
		case idem.OutcomeInProgress:
			s.metrics.inProgress.WithLabelValues(operation).Inc()
		}
		if d.ExpiredRetry {
			s.metrics.expiredRetries.WithLabelValues(operation).Inc()
		}
	}
	s.metrics.requests.WithLabelValues(operation, outcome).Inc()
	s.metrics.latency.WithLabelValues(operation, outcome).Observe(elapsed.Seconds())
}

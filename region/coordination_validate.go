package region

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/ident"
)

// coordScope reads {operation} and {key}: the key must be a valid idempotency
// key (400; "." and ".." are not, so no record is made under a key that a
// path cleaner between the caller and the node would resolve away), the
// operation 1-64 characters of [a-z0-9_.-] other than "." and ".." (422),
// not one the node serves itself (422), and one the node declares
// (Config.Operations; 404 OPERATION_UNKNOWN otherwise). Every coordination
// endpoint reads its scope here, before its body or the store. The message
// never echoes the name.
func (s *Server) coordScope(r *http.Request, tenant string) (idem.Scope, error) {
	op, key := r.PathValue("operation"), r.PathValue("key")
	if !idem.ValidKey(key) {
		return idem.Scope{}, idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters, other than \".\" and \"..\".")
	}
	if !idem.ValidOperation(op) {
		return idem.Scope{}, idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-', other than \".\" and \"..\".", idem.MaxOperationLen)
	}
	if _, mine := s.own[op]; mine {
		// The node's own operations keep their records to themselves: their
		// recovery worker acts on them and their stored bodies are never shown.
		return idem.Scope{}, idem.Errorf(idem.ECodeValidationFailed, "Operation %q is reserved for the node's own API.", op)
	}
	if !s.operations[op] {
		return idem.Scope{}, idem.Errorf(idem.ECodeOperationUnknown, "This node does not serve that operation.")
	}
	return idem.Scope{Tenant: tenant, Operation: op, Key: key}, nil
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

func responseFrom(in *coordapi.ResponseInput) (*idem.Response, error) {
	if in.Status == nil || *in.Status < 100 || *in.Status > 599 {
		return nil, idem.Errorf(idem.ECodeValidationFailed, "Field \"response.status\" must be an HTTP status code (100-599).")
	}
	if len(in.Headers) > maxReplayHeaders {
		return nil, idem.Errorf(idem.ECodeValidationFailed, "Field \"response.headers\" holds more than %d headers.", maxReplayHeaders)
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

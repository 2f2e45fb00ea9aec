// Package coordapi holds the JSON bodies of a regional node's coordination
// API (docs/openapi.yaml, paths under /v1/coordination), shared by the
// server (package region) and the Go client (package coordclient) so that
// the two cannot drift apart.
//
// The request bodies use pointers where the server must tell an absent
// member from a zero one; the server decodes them with package
// internal/strictjson (exact names, no duplicates, no unknown members),
// the client encodes them with encoding/json. The answers are written by the
// server with encoding/json and read by the client the same way. Byte
// slices travel as base64 (standard alphabet, padded), as encoding/json
// writes []byte.
//
// The package has no behaviour: validation of the values lives in the
// server, conversion from and to package idem's types in each side.
package coordapi

import (
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// Response is a stored response as the server sends it (in a replay, or
// with a record). Headers and Body are never null in the server's answers.
type Response struct {
	Status        int               `json:"status"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion"`
}

// ResponseInput is a response to store, sent with complete or fail. Status
// is required (100-599).
type ResponseInput struct {
	Status        *int              `json:"status"`
	Headers       map[string]string `json:"headers,omitempty"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion,omitempty"`
}

// Record is the inspection view of a record, as GET
// /v1/idempotency/records/{operation}/{key} and the coordination API send
// it. It never includes the stored response body.
type Record struct {
	Operation             string     `json:"operation"`
	Key                   string     `json:"key"`
	Status                string     `json:"status"`
	Checkpoint            string     `json:"checkpoint"`
	RequestHash           string     `json:"requestHash"`
	HashVersion           int        `json:"hashVersion"`
	Owner                 string     `json:"owner"`
	FencingToken          int64      `json:"fencingToken"`
	LockedUntil           *time.Time `json:"lockedUntil,omitempty"`
	Attempts              int        `json:"attempts"`
	Generation            int        `json:"generation"`
	ResponseStatus        int        `json:"responseStatus,omitempty"`
	ResponseSchemaVersion string     `json:"responseSchemaVersion,omitempty"`
	ResourceType          string     `json:"resourceType,omitempty"`
	ResourceID            string     `json:"resourceId,omitempty"`
	ErrorCode             string     `json:"errorCode,omitempty"`
	HomeRegion            string     `json:"homeRegion"`
	CreatedAt             time.Time  `json:"createdAt"`
	UpdatedAt             time.Time  `json:"updatedAt"`
	ExpiresAt             time.Time  `json:"expiresAt"`
}

// BeginRequest is the body of POST .../begin: exactly one of RequestHash
// ("v<N>:<hash>") and Command (the command object, hashed by the server).
type BeginRequest struct {
	RequestHash        *string        `json:"requestHash,omitempty"`
	Command            jsontext.Value `json:"command,omitempty"`
	LockTimeoutSeconds *int64         `json:"lockTimeoutSeconds,omitempty"`
	WindowSeconds      *int64         `json:"windowSeconds,omitempty"`
	Owner              *string        `json:"owner,omitempty"`
	// ClaimID names the caller's claim across its attempts: a begin whose
	// answer was lost, sent again with the same claimId, is answered with
	// the record it claimed and its fencing token (an open record this
	// claim inserted or took over), where another caller would find the
	// key in progress. 16 to 64 visible ASCII characters, drawn at random
	// once per request (128 bits or more); never shared by two requests.
	ClaimID *string `json:"claimId,omitempty"`
}

// BeginAnswer is the answer to begin. FencingToken is set when the caller
// now owns the record; Response only on the outcome "replay". The server
// always sends Record.
type BeginAnswer struct {
	Outcome      string    `json:"outcome"`
	FencingToken int64     `json:"fencingToken,omitempty"`
	Record       *Record   `json:"record"`
	Response     *Response `json:"response,omitempty"`
	ExpiredRetry bool      `json:"expiredRetry"`
}

// RecordAnswer is the answer to GET /v1/coordination/{operation}/{key}: the
// record with its stored response, if any. The server always sends Record.
type RecordAnswer struct {
	Record   *Record   `json:"record"`
	Response *Response `json:"response,omitempty"`
}

// CheckpointRequest is the body of POST .../checkpoint; both members are
// required.
type CheckpointRequest struct {
	FencingToken *int64  `json:"fencingToken"`
	Checkpoint   *string `json:"checkpoint"`
}

// CompleteRequest is the body of POST .../complete; FencingToken and
// Response are required.
type CompleteRequest struct {
	FencingToken *int64         `json:"fencingToken"`
	Response     *ResponseInput `json:"response"`
	ResourceType string         `json:"resourceType,omitempty"`
	ResourceID   string         `json:"resourceId,omitempty"`
}

// FailRequest is the body of POST .../fail; FencingToken and Status
// ("failed_replayable", "failed_retryable" or "unknown") are required.
type FailRequest struct {
	FencingToken *int64         `json:"fencingToken"`
	Status       *string        `json:"status"`
	ErrorCode    string         `json:"errorCode,omitempty"`
	Response     *ResponseInput `json:"response,omitempty"`
}

// Error is the body of every error answer of the node: a stable code (see
// README.md's error-code table) and a message for people.
type Error struct {
	ErrorCode string `json:"errorCode"`
	Message   string `json:"message"`
}

// Package adminapi holds the JSON bodies of a regional node's admin API
// (docs/openapi.yaml, paths under /v1/admin): the records an operator
// finds, inspects and settles by hand when recovery cannot (idemctl
// records --node). It is shared by the server (package region) and
// idemctl, so that the two cannot drift apart.
//
// The request body uses pointers where the server must tell an absent
// member from a zero one; the server decodes it with package
// internal/strictjson (exact names, no duplicates, no unknown members).
// Byte slices travel as base64 (standard alphabet, padded), as
// encoding/json writes []byte. Times are the store's clock.
//
// The package has no behaviour: validation lives in the server (and in
// store.Store.Settle), conversion in each side.
package adminapi

import (
	"time"

	"github.com/idemcoord/idem/coordapi"
)

// Record is a record as an operator sees it: the inspection view of a
// tenant's record (coordapi.Record: never the stored answer's headers or
// body) with its tenant, the stored body's size, whether it is stuck, and
// who settled it by hand.
type Record struct {
	Tenant string `json:"tenant"`
	coordapi.Record
	// ResponseBytes is the stored body's size; ResponseByReference says
	// the record renders its answer from its resource (and stores no
	// body).
	ResponseBytes       int  `json:"responseBytes,omitempty"`
	ResponseByReference bool `json:"responseByReference,omitempty"`
	// LockHeld says the lock had not run out when the record was read
	// (StoreTime); Stuck that the record could be settled then
	// (UNKNOWN_REQUIRES_RECOVERY, or IN_PROGRESS past its lock).
	LockHeld   bool        `json:"lockHeld"`
	Stuck      bool        `json:"stuck"`
	Settlement *Settlement `json:"settlement,omitempty"`
	// StoreTime is the store's clock when the record was read.
	StoreTime time.Time `json:"storeTime"`
}

// Settlement is who settled a record by hand, when and why, and as what.
type Settlement struct {
	As     string    `json:"as"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// RecordList is the answer to GET /v1/admin/records: a page of records in
// (tenant, operation, key) order. NextCursor, when set, is the cursor
// query parameter of the next page.
type RecordList struct {
	Records    []Record `json:"records"`
	NextCursor string   `json:"nextCursor,omitempty"`
}

// SettleRequest is the body of POST
// /v1/admin/records/{tenant}/{operation}/{key}/settle: As
// (FAILED_RETRYABLE, COMPLETED or FAILED_REPLAYABLE) and Reason are
// required; Answer is required with COMPLETED and FAILED_REPLAYABLE and
// refused with FAILED_RETRYABLE.
type SettleRequest struct {
	As     *string      `json:"as"`
	Reason *string      `json:"reason"`
	Answer *AnswerInput `json:"answer,omitempty"`
}

// AnswerInput is the answer a record is settled with, replayed to every
// retry: Status is required (100-599), Headers optional, Body the exact
// bytes (empty when absent).
type AnswerInput struct {
	Status  *int              `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}

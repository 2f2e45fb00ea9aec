package chaos

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Role says why a client sent a request, which decides what answer the
// checks expect.
type Role string

// Client roles.
const (
	// RoleNormal: a well-behaved client, one key per command, retried with
	// the same key until it gets a definite answer.
	RoleNormal Role = "normal"
	// RoleRacer: like RoleNormal, but the first attempt goes to several
	// regions at once (a cross-region race on one key).
	RoleRacer Role = "racer"
	// RoleReuser: a buggy client that reuses a key with a different
	// amount once the first command has a definite answer.
	RoleReuser Role = "reuser"
	// RoleNoKey: a client without idempotency keys of its own: it resends
	// the same command (same merchant reference) with a fresh key.
	RoleNoKey Role = "nokey"
	// RoleExpiry: like RoleNormal, then retries the same key after the
	// replay window has passed.
	RoleExpiry Role = "expiry"
)

// Answer classes of an operation, as the linearizability model and the
// checks see them.
const (
	// ClassFinal: a stored, replayable answer (201, 402, 409
	// DUPLICATE_MERCHANT_REFERENCE).
	ClassFinal = "final"
	// ClassConflict: 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST.
	ClassConflict = "conflict"
	// ClassInProgress: 409 IDEMPOTENCY_REQUEST_IN_PROGRESS.
	ClassInProgress = "in-progress"
	// ClassAmbiguous: the request may or may not have taken effect: a
	// timeout or transport error, a 5xx, 202 PAYMENT_OUTCOME_UNKNOWN.
	ClassAmbiguous = "ambiguous"
	// ClassRejected: refused before anything was stored (other 4xx).
	ClassRejected = "rejected"
)

// Error codes the workload and checks look at.
const (
	codeKeyReused      = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"
	codeInProgress     = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	codeDuplicateRef   = "DUPLICATE_MERCHANT_REFERENCE"
	codeOutcomeUnknown = "PAYMENT_OUTCOME_UNKNOWN"
	codeInternal       = "INTERNAL"
)

// Op is one recorded client call: a POST /payments and its answer.
type Op struct {
	ID     int    `json:"id"`
	Client int    `json:"client"`
	Lane   int    `json:"lane"` // the client's concurrent lane (a racer uses several)
	Role   Role   `json:"role"`
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	// Epoch is 0, or 1 for a retry sent after the key's replay window.
	Epoch int `json:"epoch,omitempty"`
	// Attempt counts the calls of one logical command with this key, from 1.
	Attempt int    `json:"attempt"`
	Region  string `json:"region"`
	Node    string `json:"node"`
	// RedirectedFrom is the node the call was meant for when that node
	// refused the connection and the call went to Node instead (a client
	// with several endpoints); "" otherwise.
	RedirectedFrom string `json:"redirectedFrom,omitempty"`
	// Command is the logical command; CommandID its normalised identity.
	Command   Command `json:"commandFields"`
	CommandID string  `json:"command"`
	// Reused marks the second, different command a RoleReuser sends.
	Reused bool `json:"reused,omitempty"`
	// Sweep marks the replay every answered command gets after the faults.
	Sweep bool   `json:"sweep,omitempty"`
	Body  string `json:"body"`
	// Start and End are offsets from the start of the run.
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
	// Status is the HTTP status, 0 when no answer came.
	Status    int    `json:"status"`
	ErrorCode string `json:"errorCode,omitempty"`
	Replayed  bool   `json:"replayed,omitempty"`
	// RespBody is the answer's body; RespHash the first 16 hex digits of
	// the SHA-256 of status and body.
	RespBody string `json:"respBody,omitempty"`
	RespHash string `json:"respHash,omitempty"`
	// PaymentID is the payment the answer names (paymentId, id or
	// existingPaymentId).
	PaymentID string `json:"paymentId,omitempty"`
	// Err is the transport error, if no answer came.
	Err string `json:"err,omitempty"`

	retryAfter time.Duration
}

// Class returns the op's answer class.
func (o *Op) Class() string {
	switch {
	case o.Status == 0 || o.Status >= 500 || o.Status == 202:
		return ClassAmbiguous
	case o.Status == 201 || o.Status == 402:
		return ClassFinal
	case o.Status == 409 && o.ErrorCode == codeDuplicateRef:
		return ClassFinal
	case o.Status == 409 && o.ErrorCode == codeKeyReused:
		return ClassConflict
	case o.Status == 409 && o.ErrorCode == codeInProgress:
		return ClassInProgress
	}
	return ClassRejected
}

// Outcome is a short label of the answer for counts and plots: the status
// and error code, or "timeout"/"error".
func (o *Op) Outcome() string {
	switch {
	case o.Status == 0 && o.Err == errTimeout:
		return "timeout"
	case o.Status == 0:
		return "error"
	case o.ErrorCode != "":
		return httpStatus(o.Status) + " " + o.ErrorCode
	case o.Replayed:
		return httpStatus(o.Status) + " replay"
	}
	return httpStatus(o.Status)
}

func httpStatus(s int) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// partitionKey groups the ops of one key (per tenant and epoch).
func (o *Op) partitionKey() string {
	return fmt.Sprintf("%s/%s#%d", o.Tenant, o.Key, o.Epoch)
}

// errTimeout is Op.Err for a call that hit the client timeout.
const errTimeout = "timeout"

// answerHash hashes an answer's status and body.
func answerHash(status int, body []byte) string {
	h := sha256.New()
	h.Write([]byte(httpStatus(status)))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// History is the record of every call of a run. It is safe for concurrent
// use.
type History struct {
	mu  sync.Mutex
	ops []*Op
}

// add appends op, assigning its ID.
func (h *History) add(op *Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.ops)
	h.ops = append(h.ops, op)
}

// Ops returns a copy of the recorded ops, ordered by start time.
func (h *History) Ops() []*Op {
	h.mu.Lock()
	out := slices.Clone(h.ops)
	h.mu.Unlock()
	slices.SortStableFunc(out, func(a, b *Op) int { return int(a.Start - b.Start) })
	return out
}

// Len returns how many calls have been recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// countSince counts ops that ended in [from, to).
func countEnded(ops []*Op, from, to time.Duration) int {
	n := 0
	for _, o := range ops {
		if o.End >= from && o.End < to {
			n++
		}
	}
	return n
}

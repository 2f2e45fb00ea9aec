package idem

import (
	"slices"
	"time"
)

// Scope identifies a claimed operation: the tenant (from the authenticated
// principal, never from a client-chosen field), the operation name and the
// client's idempotency key. Keys are unique only within their scope.
type Scope struct {
	Tenant    string
	Operation string
	Key       string
}

// Status is the internal state of a record. Clients never see it directly; the
// region package maps each state to an HTTP answer.
type Status string

// Record states.
const (
	// StatusInProgress: an owner holds the record until LockedUntil.
	StatusInProgress Status = "IN_PROGRESS"
	// StatusCompleted: the operation finished; its response is replayed.
	StatusCompleted Status = "COMPLETED"
	// StatusFailedReplayable: a deterministic rejection; replayed like a success.
	StatusFailedReplayable Status = "FAILED_REPLAYABLE"
	// StatusFailedRetryable: failed before any side effect; a retry with the
	// same key executes again under the same identity.
	StatusFailedRetryable Status = "FAILED_RETRYABLE"
	// StatusUnknown: a side effect may have happened but its result was lost;
	// only recovery (asking downstream) may move it on.
	StatusUnknown Status = "UNKNOWN_REQUIRES_RECOVERY"
	// StatusExpired: past the replay window; a retry is a new operation.
	StatusExpired Status = "EXPIRED"
)

// Settled reports whether a record in this state has a known outcome
// (COMPLETED, FAILED_REPLAYABLE, FAILED_RETRYABLE or EXPIRED).
func (s Status) Settled() bool {
	switch s {
	case StatusCompleted, StatusFailedReplayable, StatusFailedRetryable, StatusExpired:
		return true
	}
	return false
}

// Checkpoint is how far an operation got. Every operation starts at
// RECEIVED and ends at COMPLETED; what lies between is the operation's own
// (each operation defines its checkpoints in its own package).
type Checkpoint string

// Checkpoints every operation shares.
const (
	// CheckpointReceived: claimed, nothing done yet.
	CheckpointReceived Checkpoint = "RECEIVED"
	// CheckpointCompleted: the operation finished.
	CheckpointCompleted Checkpoint = "COMPLETED"
)

// Response is a stored answer, replayed byte for byte.
type Response struct {
	// Status is the HTTP status code of the first answer.
	Status int
	// Headers holds the selected headers that are part of the replay contract.
	Headers map[string]string
	// Body is the exact body bytes of the first answer.
	Body []byte
	// SchemaVersion names the response schema the body was written in (for
	// example "v2"); see the replay rule in docs/http-api.md.
	SchemaVersion string
	// ByReference marks a referencing record: the store keeps Status and
	// SchemaVersion with the record's resource reference (ResourceType,
	// ResourceID) but neither Headers nor Body, and the operation's replay
	// renders them again, byte for byte, from the resource. It suits an
	// answer that is a pure function of an immutable resource and the
	// schema version: rows are smaller and hold no copy of the resource's
	// data. Set it on a Completion's Response (Headers and Body still carry
	// the first answer, which the client gets); a record read back has
	// Headers and Body nil. Only an operation with a replay that renders
	// may write one (engine.Operation.Replay).
	ByReference bool
}

// Record is the durable memory of one scoped operation. All timestamps come
// from the store's clock.
type Record struct {
	Scope
	// RequestHash is the fingerprint of the first command, prefixed with its
	// hash version ("v1:...").
	RequestHash string
	// RawHash is the raw hash of the first request (fingerprint.RawHash:
	// its body's bytes with everything else its command is parsed from),
	// or "" for a record claimed without one (before the engine's
	// migration 0011, or over a Coordinator that keeps none). It is never
	// compared with RequestHash: a retry with the same raw hash is the same
	// command, told without parsing it (engine.Request.RawHash); any other
	// is compared by its request hashes.
	RawHash     string
	HashVersion int
	Status      Status
	Checkpoint  Checkpoint
	// Owner names the process that holds (or last held) the record.
	Owner string
	// FencingToken increases every time ownership changes hands; writes by an
	// owner carry it and are rejected when it is no longer current.
	FencingToken int64
	// LockedUntil is when the owner's claim goes stale (store clock).
	LockedUntil *time.Time
	// Attempts counts executions (first claim plus takeovers).
	Attempts int
	// Generation counts how many times the key was reused after its window.
	Generation   int
	Response     *Response
	ResourceType string
	ResourceID   string
	ErrorCode    string
	HomeRegion   string
	CreatedAt    time.Time
	UpdatedAt    time.Time
	ExpiresAt    time.Time
}

// Lease is the right to write a record: the scope plus the fencing token it
// was granted under. Every write by an owner carries its Lease.
type Lease struct {
	Scope
	Token int64
	Owner string
}

// Outcome is what a request with an idempotency key is allowed to do.
type Outcome int

// Outcomes of a claim.
const (
	// OutcomeExecute: this request owns the key and must perform the operation.
	OutcomeExecute Outcome = iota + 1
	// OutcomeReplay: the operation finished; replay the stored response.
	OutcomeReplay
	// OutcomeConflict: the key was used with a different command.
	OutcomeConflict
	// OutcomeInProgress: another owner holds the key; answer 409 + Retry-After
	// or wait.
	OutcomeInProgress
	// OutcomeRecover: the record is stale, failed retryably or unknown; this
	// request may take ownership (atomically, fenced) and recover it.
	OutcomeRecover
	// OutcomeExpired: the record is past its window; the request is a new
	// operation and may take the key over (atomically, fenced).
	OutcomeExpired
)

var outcomeNames = map[Outcome]string{
	OutcomeExecute:    "execute",
	OutcomeReplay:     "replay",
	OutcomeConflict:   "conflict",
	OutcomeInProgress: "in_progress",
	OutcomeRecover:    "recover",
	OutcomeExpired:    "expired",
}

// String returns the outcome's metric label.
func (o Outcome) String() string {
	if s, ok := outcomeNames[o]; ok {
		return s
	}
	return "unknown"
}

// Outcome labels of a request the engine did not decide, beside each
// Outcome's String: every surface (the middleware, the sidecar, the node,
// the gRPC interceptor) counts its requests by these labels alone.
const (
	// LabelRejected: the request was refused before the engine decided
	// (no key, a bad key, a body too large, an unknown tenant, a bad
	// command).
	LabelRejected = "rejected"
	// LabelError: the engine could not give an answer (the store
	// unavailable, say).
	LabelError = "error"
)

// OutcomeLabels returns every outcome label a request is counted by: the
// outcomes' own, LabelRejected and LabelError. Metrics create their series
// from it, so that no label value comes from anywhere else.
func OutcomeLabels() []string {
	return []string{OutcomeExecute.String(), OutcomeReplay.String(), OutcomeConflict.String(), OutcomeInProgress.String(),
		OutcomeRecover.String(), OutcomeExpired.String(), LabelRejected, LabelError}
}

// ErrorLabel is the outcome label of a request answered with err instead
// of a decision: a key reused with another command is a conflict, a key
// another owner holds in progress, anything else LabelError.
func ErrorLabel(err error) string {
	switch ErrorCode(err) {
	case ECodeKeyReused:
		return OutcomeConflict.String()
	case ECodeInProgress:
		return OutcomeInProgress.String()
	}
	return LabelError
}

// Decide says what a request whose command hashes to one of requestHashes may
// do with the existing record rec, at the store's time now. requestHashes holds
// the request's fingerprint under every hash version the node supports, so a
// record written under an older version still compares like with like.
//
// Decide reads; it never grants anything. Recover and Expired outcomes are
// acted on by a conditional, fenced update in the store, which exactly one of
// many concurrent requests wins.
//
// A record past its window answers as Expired (the request is a new
// operation) only once its outcome is settled; a record still IN_PROGRESS or
// UNKNOWN_REQUIRES_RECOVERY cannot be forgotten, because money may have moved,
// so it keeps going through recovery whatever its age.
func Decide(rec *Record, requestHashes []string, now time.Time) Outcome {
	if rec.Status == StatusExpired || (!rec.ExpiresAt.After(now) && rec.Status.Settled()) {
		return OutcomeExpired
	}
	if !slices.Contains(requestHashes, rec.RequestHash) {
		return OutcomeConflict
	}
	switch rec.Status {
	case StatusCompleted, StatusFailedReplayable:
		return OutcomeReplay
	case StatusFailedRetryable:
		return OutcomeRecover
	case StatusInProgress, StatusUnknown:
		if rec.LockedUntil != nil && rec.LockedUntil.After(now) {
			return OutcomeInProgress
		}
		return OutcomeRecover
	}
	return OutcomeConflict
}

// DecideOwnClaim says what a request may do with rec when rec is its own
// claim's record: holder is the claim id rec was last claimed under (empty
// for none) and claim the request's. A claim whose commit went unanswered
// and is sent again finds the record it wrote; it gets its lease back
// rather than a refusal as "in progress". ok is false unless claim is set,
// equals holder and rec is still IN_PROGRESS; then the outcome is
// OutcomeExecute while rec is as an insert for start left it (its first
// attempt at that checkpoint), or OutcomeRecover (a takeover's record, or
// one its owner has moved on). Every Coordinator that keeps claim ids
// decides a claim sent again by it, before Decide.
func DecideOwnClaim(rec *Record, claim, holder string, start Checkpoint) (outcome Outcome, ok bool) {
	if claim == "" || claim != holder || rec.Status != StatusInProgress {
		return 0, false
	}
	if rec.Attempts == 1 && rec.Checkpoint == start {
		return OutcomeExecute, true
	}
	return OutcomeRecover, true
}

// MaxOperationLen is the longest operation name.
const MaxOperationLen = 64

// ValidOperation reports whether op is a well-formed operation name: 1 to
// MaxOperationLen characters of a-z, 0-9, '_', '.' and '-', other than "."
// and ".." (path segments that URL normalisation removes; see ValidKey).
func ValidOperation(op string) bool {
	if len(op) == 0 || len(op) > MaxOperationLen || op == "." || op == ".." {
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

// ValidKey reports whether key is a well-formed idempotency key: 1 to 255
// visible ASCII characters (0x21-0x7E), other than "." and "..". Those two
// would be path segments that URL normalisation removes (RFC 3986's
// remove_dot_segments; WHATWG URL parsers and proxies treat %2E alike), so
// a record under such a key could not be named in a path reliably (the
// coordination API, GET /v1/idempotency/records/{operation}/{key}).
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > 255 || key == "." || key == ".." {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

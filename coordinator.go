package idem

import (
	"context"
	"time"
)

// BeginRequest asks for the right to execute a scoped operation.
type BeginRequest struct {
	Scope
	// RequestHashes is the command's fingerprint under every supported hash
	// version, current version first. The first one is stored on insert.
	RequestHashes []string
	// HashVersion is the version of RequestHashes[0].
	HashVersion int
	// RawHash, optional, is the request's raw hash (fingerprint.RawHash),
	// stored beside RequestHashes[0] by a claim that inserts the record or
	// takes an expired one over (Record.RawHash). It decides nothing here:
	// a Coordinator decides by RequestHashes.
	RawHash string
	// ClaimID, optional, names this request's claim across its attempts
	// (at most 64 characters; the engine draws one per Do). A claim whose
	// commit went unanswered may have stored the record: attempted again
	// with the same ClaimID, the Coordinator recognises the record that
	// claim inserted or took over, still open, as this request's own and
	// hands it back (its Lease), where another request would find the key
	// in progress. A Coordinator without unknown commits may ignore it;
	// the store draws one when it is empty.
	ClaimID string
	// Owner names the caller (for diagnostics; ownership itself is the token).
	Owner string
	// HomeRegion is recorded on the record.
	HomeRegion string
	// LockFor is how long the owner may hold the record before it counts as
	// stale and a retry may take it over. Measured on the store's clock.
	LockFor time.Duration
	// Window is the replay window: how long the record answers retries.
	Window time.Duration
	// ExternalFencing makes recovery takeovers depend on an external lock
	// service (etcd): without a FencingToken, Begin reports OutcomeRecover
	// but takes no ownership (Lease is zero), so the caller can acquire the
	// scope's lock and call Begin again with its token.
	ExternalFencing bool
	// FencingToken is the token of an external lock on the scope (the lock
	// key's etcd create revision). A takeover sets the record's token to it,
	// and only if it is higher than the record's current token.
	FencingToken int64
	// StartAt, when set, is the checkpoint a record inserted for a free key
	// begins at, instead of CheckpointReceived: a caller that acts at once
	// when it gets the key (the engine's Execute) records that it may have
	// started in the claim itself, saving a write. A Coordinator may ignore
	// it (the record then shows CheckpointReceived, and the caller writes
	// its checkpoint itself). Takeovers do not use it.
	StartAt Checkpoint
}

// Validate refuses a request no Coordinator may act on, with the codes a
// client sees: a scope without tenant or operation, an invalid key, no
// request hash, a lock or window that is not positive, a StartAt that is
// too long or COMPLETED. Every Coordinator calls it first, so they refuse
// alike.
func (r BeginRequest) Validate() error {
	switch {
	case r.Tenant == "" || r.Operation == "":
		return Errorf(ECodeValidationFailed, "A scope needs a tenant and an operation.")
	case !ValidKey(r.Key):
		return Errorf(ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters, other than \".\" and \"..\".")
	case len(r.RequestHashes) == 0 || r.RequestHashes[0] == "":
		return Errorf(ECodeValidationFailed, "A request hash is required.")
	case r.LockFor <= 0 || r.Window <= 0:
		return Errorf(ECodeValidationFailed, "Lock duration and replay window must be positive.")
	case len(r.ClaimID) > 64:
		return Errorf(ECodeValidationFailed, "A claim id is at most 64 characters.")
	case len(r.StartAt) > 64 || r.StartAt == CheckpointCompleted:
		return Errorf(ECodeValidationFailed, "A record cannot start at checkpoint %q.", r.StartAt)
	}
	return nil
}

// StartCheckpoint is the checkpoint a record inserted for a free key
// begins at: StartAt, or CheckpointReceived without one.
func (r BeginRequest) StartCheckpoint() Checkpoint {
	if r.StartAt == "" {
		return CheckpointReceived
	}
	return r.StartAt
}

// Decision is the answer to Begin.
type Decision struct {
	Outcome Outcome
	// Lease is set when the caller now owns the record (OutcomeExecute,
	// OutcomeRecover, OutcomeExpired): its writes must carry it.
	Lease Lease
	// Record is the record as it stood when the decision was made. For
	// OutcomeRecover it shows the checkpoint the previous owner reached.
	Record *Record
	// ExpiredRetry is true when the key had a record past its window and this
	// request became a new operation.
	ExpiredRetry bool
}

// Completion is what an owner stores when an operation finishes.
type Completion struct {
	Response     Response
	ResourceType string
	ResourceID   string
}

// Failure is what an owner stores when an operation does not complete.
// Status must be StatusFailedReplayable (deterministic rejection, replayed),
// StatusFailedRetryable (no side effect happened; a retry executes again) or
// StatusUnknown (a side effect may have happened; recovery must ask downstream).
type Failure struct {
	Status    Status
	ErrorCode string
	// Response is stored for FailedReplayable and replayed as is.
	Response *Response
}

// Coordinator is the contract the idempotency engine runs over, satisfied
// by *store.Store (PostgreSQL or CockroachDB, in process) and by
// *coordclient.Client (a regional node's coordination API over HTTP), so a
// service can switch between the two; *memcoord.Coordinator keeps records
// in memory for unit tests. Package coordtest is the contract suite every
// one of them passes.
type Coordinator interface {
	// Begin claims the scoped key (insert first) or reports what the existing
	// record allows.
	Begin(ctx context.Context, req BeginRequest) (Decision, error)
	// Checkpoint records progress. It fails with ErrFenced when lease is no
	// longer current.
	Checkpoint(ctx context.Context, lease Lease, cp Checkpoint) error
	// Complete stores the final answer. It fails with ErrFenced when lease is no
	// longer current.
	Complete(ctx context.Context, lease Lease, c Completion) error
	// Fail stores a classified failure. It fails with ErrFenced when lease is
	// no longer current.
	Fail(ctx context.Context, lease Lease, f Failure) error
	// Get returns the record of scope, or ErrRecordNotFound.
	Get(ctx context.Context, scope Scope) (*Record, error)
}

// Sentinel errors, checked with errors.Is.
var (
	// ErrFenced: a write carried a fencing token lower than the record's
	// current one; another owner has taken over.
	ErrFenced = &Error{Code: ECodeFencingTokenStale, Message: "The fencing token is stale: another owner holds this record."}
	// ErrRecordNotFound: no record for the scope (or not visible to the caller).
	ErrRecordNotFound = &Error{Code: ECodeRecordNotFound, Message: "No idempotency record exists for this key."}
)

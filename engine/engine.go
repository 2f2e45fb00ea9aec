package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/ctxtime"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Defaults of Options and Operation.
const (
	DefaultWindow  = 24 * time.Hour
	DefaultLockFor = 30 * time.Second
	DefaultMaxWait = 60 * time.Second
	DefaultPollMin = 20 * time.Millisecond
	DefaultPollMax = 500 * time.Millisecond
	// writeTimeout bounds releasing an etcd lock and each write that ends
	// an attempt after its caller has gone.
	writeTimeout = 5 * time.Second
)

// CheckpointStarted is where a record stands before Execute is called (the
// claim inserts a free key's record at it; a takeover writes it): a record
// taken over at any checkpoint other than idem.CheckpointReceived may have
// had a side effect.
const CheckpointStarted idem.Checkpoint = "STARTED"

// Clock is the engine's time source. Record times (locks, windows) are the
// store's; the engine's clock only bounds how long a request waits.
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx is done (then it returns ctx.Err()).
	Sleep(ctx context.Context, d time.Duration) error
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error { return ctxtime.Sleep(ctx, d) }

// Locker takes a scope's recovery lock in an external lock service;
// *fencing.Locker (etcd; a Lock's Token is its key's create revision) and
// *routing.Membership satisfy it. TryLock does not wait: when another owner
// holds key it fails with an error wrapping idem.ErrLocked, and the request
// is answered as in progress; any other error answers unavailable.
type Locker interface {
	TryLock(ctx context.Context, key string) (idem.Lock, error)
}

// StaleLister lists records of an operation that nobody is working on;
// *store.Store satisfies it (ListStale).
type StaleLister interface {
	ListStale(ctx context.Context, operation string, limit int) ([]*idem.Record, error)
}

// LockKey is the lock name of a scope: <tenant>/<operation>/<key>, each part
// path-escaped: every user of the engine's Locker names a scope's lock so,
// and so fences the others.
func LockKey(scope idem.Scope) string {
	return url.PathEscape(scope.Tenant) + "/" + url.PathEscape(scope.Operation) + "/" + url.PathEscape(scope.Key)
}

// Options configure an Engine. The zero value works (no external fencing,
// no stale listing unless the Coordinator lists).
type Options struct {
	// Owner names this process in the records it owns. Default "engine".
	Owner string
	// HomeRegion is recorded on new records. Default "local".
	HomeRegion string
	// Locker, when set, fences takeovers with an external lock (etcd): the
	// engine locks the scope and the record carries the lock's token. Nil
	// uses the store's own counter. A remote coordclient.Client always uses
	// the node's counter (the coordination API takes no external token).
	Locker Locker
	// Stale lists stale records for RecoverStale. Default: the Coordinator,
	// if it is a StaleLister (*store.Store is); otherwise RecoverStale
	// fails.
	Stale StaleLister
	// Clock bounds waits. Default: the system clock.
	Clock Clock
	// Logger receives conflicts and failures. Default: discard.
	Logger *slog.Logger
	// MaxWait caps Request.Wait. Default DefaultMaxWait (60s).
	MaxWait time.Duration
	// PollMin and PollMax bound the backoff between polls of a record in
	// progress. Defaults DefaultPollMin (20ms) and DefaultPollMax (500ms).
	PollMin, PollMax time.Duration
	// AnswerCache keeps the answers of settled records in memory, up to
	// AnswerCache.Bytes, so that Do replays a retry (or refuses a reused
	// key) with no store round trip; its entries live on Clock. Default:
	// off (see AnswerCache for what it keeps).
	AnswerCache AnswerCache
}

// ExecuteFunc performs an operation under an Attempt's lease. Its ctx ends
// at the attempt's lock timeout (an owner must not outlive its lock) and
// not before: it carries the values of Do's ctx but not its cancellation,
// so a client that goes away does not cut off a call it started, and the
// answer is stored for its retry.
type ExecuteFunc func(ctx context.Context, a *Attempt) (Result, error)

// ClaimFunc claims a request's key in place of the Coordinator's Begin: an
// operation over the in-process store calls store.ClaimTx (or its own
// insert-first statement) in a transaction of its own, together with rows
// of its own, and may even finish the operation there (Claim.Done). It
// must decide exactly as Begin does, including the replay fast path if it
// wants one (store.ReadSettled). When the record must be taken over under
// the scope's external lock (BeginRequest.ExternalFencing and no
// FencingToken), it returns a Decision with OutcomeRecover and no lease,
// as Begin does; the engine then takes the lock and calls it again with
// the lock's token. An error wrapping idem.ErrFenced answers in progress.
//
// With the answer cache on (Options.AnswerCache), a replay a ClaimFunc
// decides is kept in memory, so it must come from a durable read (as
// store.ReadSettled, store.Store.ReadSettledWith, store.ClaimTx and
// store.DecideExisting make theirs), and a Claim.Done that settled the
// record is kept, so its transaction's commit must have been answered (a
// commit whose answer was lost is an error, never a Done).
type ClaimFunc func(ctx context.Context, req idem.BeginRequest) (Claim, error)

// Claim is what a ClaimFunc decided.
type Claim struct {
	// Decision is what Begin would have returned. Its Record is the record
	// as found or taken over (its Checkpoint is how far an earlier owner
	// got); for a new key it may be nil.
	Decision idem.Decision
	// Progress, when set, is a checkpoint the claim's own transaction
	// wrote (rows of the operation's own came with it): the claim has
	// started the operation, so the engine writes no CheckpointStarted
	// and calls Execute even if the client has gone (Execute owns the
	// rest). The engine still chooses Execute or Recover by
	// Decision.Record's checkpoint, the earlier owner's.
	Progress idem.Checkpoint
	// Done, when set, says the claim's transaction also finished the
	// operation and stored the record's final state (as with
	// Result.Stored): the engine calls nothing and answers Done.
	Done *Result
}

// ReplayFunc renders the answer to a retry of a finished record (COMPLETED
// or FAILED_REPLAYABLE); rec.Response is what was stored. An operation
// that stores referencing records (idem.Response.ByReference) renders their
// headers and body here from rec's resource; the engine refuses to replay
// one whose operation has no ReplayFunc.
type ReplayFunc func(ctx context.Context, rec *idem.Record) (idem.Response, error)

// Operation is a named operation the engine can run.
type Operation struct {
	// Name is the operation part of every scope (required).
	Name string
	// Execute performs the operation (required unless every Request brings
	// its own).
	Execute ExecuteFunc
	// Recover settles a record a previous owner left after it may have
	// acted (checkpoint other than RECEIVED): it asks downstream what
	// happened and reports it as a Result (COMPLETED, FAILED_REPLAYABLE,
	// FAILED_RETRYABLE if nothing happened, UNKNOWN if it still cannot
	// tell). Attempt.Record shows how far the previous owner got. Optional:
	// without it such records stay UNKNOWN_REQUIRES_RECOVERY.
	Recover ExecuteFunc
	// Window is the replay window. Default DefaultWindow (24h).
	Window time.Duration
	// LockFor is how long an owner holds the record before a retry may
	// take it over; it also bounds Execute. Default DefaultLockFor (30s).
	LockFor time.Duration
	// UnknownCode is the error code stored with, and answered for, an
	// outcome that is not known yet. Default idem.ECodeOutcomeUnknown
	// (OUTCOME_UNKNOWN); an operation whose clients already know another
	// code keeps it.
	UnknownCode string
	// Claim, when set, claims a request's key in place of the
	// Coordinator's Begin (see ClaimFunc). RecoverStale always takes
	// records over with Begin. Optional.
	Claim ClaimFunc
	// Replay, when set, renders a replayed answer from the stored record
	// (a response stored under an older schema rebuilt in the current
	// one, say). Default: the stored response, byte for byte.
	Replay ReplayFunc
}

// Result is how an Execute or Recover call ended.
type Result struct {
	// Response is the answer, stored for COMPLETED and FAILED_REPLAYABLE.
	Response idem.Response
	// Status is the record's next state: "" or idem.StatusCompleted,
	// idem.StatusFailedReplayable, idem.StatusFailedRetryable or
	// idem.StatusUnknown.
	Status idem.Status
	// ErrorCode is stored with a failure.
	ErrorCode    string
	ResourceType string
	ResourceID   string
	// Stored says that Execute or Recover already wrote the record's next
	// state under the attempt's lease, in the same transaction as its own
	// rows (an order and its outbox event, say): the engine writes nothing
	// and reports Status (which must then be set when the error is nil).
	// With the answer cache on, a stored COMPLETED or FAILED_REPLAYABLE
	// result with a nil error is kept in memory as Response: report it
	// only once the transaction's commit was answered.
	// An error returned with a Stored result goes to the caller as it is:
	// the operation has recorded what it means (or, if Status is empty,
	// chose to leave the record as it is, to go stale at its lock).
	Stored bool
	// RecoveryOutcome, set by Recover, is the outcome RecoverStale counts
	// for the record instead of the one its Status maps to (a "declined"
	// apart from other failures, say).
	RecoveryOutcome string
}

// Attempt is the right to act on a record: its lease, the record as taken,
// and (with a Locker) the scope's external lock.
type Attempt struct {
	// Lease is carried by every write; Lease.Token is the fencing token
	// downstream calls should carry too.
	Lease idem.Lease
	// Record is the record as this attempt took it: Record.Checkpoint is
	// how far an earlier owner got (RECEIVED for a new key).
	Record *idem.Record
	// Outcome is how the record was claimed: idem.OutcomeExecute (a new
	// key), idem.OutcomeRecover (taken over from an earlier owner) or
	// idem.OutcomeExpired (a key reused after its window).
	Outcome idem.Outcome
	// Background is true when RecoverStale runs the attempt: no client is
	// waiting for it, so a Recover may choose to settle only what needs no
	// client (release a command downstream never saw, say, rather than
	// act on it on its own).
	Background bool
	coord      idem.Coordinator
	lock       idem.Lock
}

// Takeover reports whether the attempt took the record over from an
// earlier owner (which may have acted, unless Record.Checkpoint is
// RECEIVED).
func (a *Attempt) Takeover() bool { return a.Outcome == idem.OutcomeRecover }

// Checkpoint records progress under the attempt's lease. It fails with
// idem.ErrFenced when another owner took over.
func (a *Attempt) Checkpoint(ctx context.Context, cp idem.Checkpoint) error {
	return a.coord.Checkpoint(ctx, a.Lease, cp)
}

// Locked reports whether the attempt holds the scope's external lock: it
// took the record over under a Locker.
func (a *Attempt) Locked() bool { return a.lock != nil }

// Check returns nil while the attempt's external lock (if any) is valid.
// Call it before a side effect; the store and downstream still reject a
// stale token if a newer owner took over after the check.
func (a *Attempt) Check() error {
	if a.lock == nil {
		return nil
	}
	if err := a.lock.Check(); err != nil {
		return &idem.Error{Code: idem.ECodeInProgress, Message: "This owner's lock ran out; another owner will finish the request.", Err: err}
	}
	return nil
}

// Request is one call of an operation.
type Request struct {
	// Operation names a registered Operation.
	Operation string
	// Tenant comes from the authenticated principal, never from the client.
	Tenant string
	// Key is the client's idempotency key (see idem.ValidKey).
	Key string
	// RequestHashes is the command's fingerprint under every supported
	// version, current first (fingerprint.Hashes). It may be left empty
	// when Fingerprint is set.
	RequestHashes []string
	// RawHash, optional, is the request's raw hash (fingerprint.RawHash
	// over its body and every other input its command is parsed from): a
	// request with the raw hash its key's settled answer was kept with is
	// the same command, replayed from memory without calling Fingerprint
	// (see sameCommand). It is stored with a record the request claims.
	RawHash string
	// Fingerprint, when set and RequestHashes is empty, parses the
	// command and returns its request hashes when Do first needs them:
	// never for a retry that RawHash decides, once for any other request,
	// before anything is claimed. Its error is Do's, as it is (a command
	// that does not parse), and nothing is stored.
	Fingerprint func() ([]string, error)
	// Wait is how long to wait for an original still in progress (capped by
	// Options.MaxWait); 0 answers at once.
	Wait time.Duration
	// Execute, when set, replaces the Operation's Execute for this request
	// (an HTTP handler bound to its request, for example).
	Execute ExecuteFunc
	// Recover, when set, replaces the Operation's Recover for this
	// request's takeovers (RecoverStale uses the Operation's).
	Recover ExecuteFunc
	// Claim, when set, replaces the Operation's Claim for this request
	// (a claim that writes rows made from the request's command).
	Claim ClaimFunc
	// RetryOn, when set, says which errors leave the request to be
	// attempted again at once, up to MaxAttempts in all, with a growing
	// pause: a commit whose outcome is unknown (store.ErrCommitUnknown),
	// whose record then answers what it did, or is claimed afresh.
	RetryOn func(error) bool
}

// MaxAttempts bounds how often Do attempts a request (Request.RetryOn).
const MaxAttempts = 6

// Answer is the outcome of Do.
type Answer struct {
	// Response is the answer: the stored one when Replayed, otherwise what
	// Execute or Recover returned.
	Response idem.Response
	// Status is the record's state after the request.
	Status idem.Status
	// Replayed is true when Response is a stored answer.
	Replayed bool
	// Outcome is what the claim decided.
	Outcome idem.Outcome
	// ExpiredRetry is true when the key's earlier record had expired.
	ExpiredRetry bool
	// Executed is true when Execute ran in the attempt that answered.
	Executed bool
	// Stored is true when the operation recorded its result itself (a
	// ClaimFunc's Claim.Done, or a Result with Stored): Response is then
	// the operation's own answer, whatever Status.
	Stored bool
	// recoveryOutcome is Result.RecoveryOutcome, for RecoverStale.
	recoveryOutcome string
	// acknowledged says that the record's final state was written by a
	// commit whose answer came back: the engine's own completion or
	// failure (AcknowledgedWriter), or the operation's own (Stored).
	acknowledged bool
}

// Engine runs registered operations over a Coordinator. It is safe for
// concurrent use.
type Engine struct {
	coord idem.Coordinator
	opts  Options
	// answers is the answer cache (nil: off).
	answers *answerCache

	mu  sync.RWMutex
	ops map[string]Operation
}

// New returns an Engine over coord.
func New(coord idem.Coordinator, opts Options) *Engine {
	if opts.Owner == "" {
		opts.Owner = "engine"
	}
	if opts.HomeRegion == "" {
		opts.HomeRegion = "local"
	}
	if opts.Stale == nil {
		opts.Stale, _ = coord.(StaleLister)
	}
	if opts.Clock == nil {
		opts.Clock = systemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultMaxWait
	}
	if opts.PollMin <= 0 {
		opts.PollMin = DefaultPollMin
	}
	if opts.PollMax < opts.PollMin {
		opts.PollMax = max(DefaultPollMax, opts.PollMin)
	}
	return &Engine{coord: coord, opts: opts, ops: map[string]Operation{},
		answers: newAnswerCache(coord, opts.AnswerCache, opts.Clock.Now)}
}

// Register adds op. Names are unique; defaults fill Window and LockFor.
func (e *Engine) Register(op Operation) error {
	if op.Name == "" {
		return errors.New("engine: register: an operation needs a name")
	}
	if op.Window <= 0 {
		op.Window = DefaultWindow
	}
	if op.LockFor <= 0 {
		op.LockFor = DefaultLockFor
	}
	if op.UnknownCode == "" {
		op.UnknownCode = idem.ECodeOutcomeUnknown
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.ops[op.Name]; ok {
		return fmt.Errorf("engine: register: operation %q is already registered", op.Name)
	}
	e.ops[op.Name] = op
	return nil
}

// Operation returns the registered operation of name (with defaults filled).
func (e *Engine) Operation(name string) (Operation, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	op, ok := e.ops[name]
	return op, ok
}

// Operations returns the names of the registered operations, sorted.
func (e *Engine) Operations() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	names := make([]string, 0, len(e.ops))
	for n := range e.ops {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// retryableError marks an Execute error after which nothing happened.
type retryableError struct{ err error }

func (r retryableError) Error() string { return r.err.Error() }
func (r retryableError) Unwrap() error { return r.err }

// Retryable wraps err, returned by Execute or Recover, to say that no side
// effect happened: the record becomes FAILED_RETRYABLE and the next request
// with the key executes again. Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return retryableError{err}
}

// IsRetryable reports whether err was wrapped by Retryable.
func IsRetryable(err error) bool {
	var r retryableError
	return errors.As(err, &r)
}

func errNoHash() error {
	return idem.Errorf(idem.ECodeValidationFailed, "A request hash is required.")
}

func errKeyReused() error {
	return idem.Errorf(idem.ECodeKeyReused, "This idempotency key was already used with a different request.")
}

func errInProgress(cause error) error {
	return &idem.Error{Code: idem.ECodeInProgress, Message: "A request with this idempotency key is still in progress; retry later.", Err: cause}
}

func errOutcomeUnknown(code string) error {
	return idem.Errorf(code, "The outcome of the request with this idempotency key is not known yet; retry with the same key later.")
}

// Do runs req: claims, replays, refuses, waits or recovers (see the package
// documentation). Errors are *idem.Error (key reused, in progress, outcome
// unknown, store unavailable, validation), or what Execute returned.
//
// With the answer cache on (Options.AnswerCache), a key whose settled
// answer is kept is replayed or refused from memory, before any claim: the
// Response of such a replay shares its Headers and Body with the cache,
// to be read and never written.
func (e *Engine) Do(ctx context.Context, req Request) (Answer, error) {
	op, ok := e.Operation(req.Operation)
	if !ok {
		return Answer{}, idem.Errorf(idem.ECodeOperationUnknown, "No such operation.")
	}
	fns := funcs{execute: op.Execute, recover: op.Recover, claim: op.Claim}
	if req.Execute != nil {
		fns.execute = req.Execute
	}
	if req.Recover != nil {
		fns.recover = req.Recover
	}
	if req.Claim != nil {
		fns.claim = req.Claim
	}
	fns.defaultClaim = fns.claim == nil
	if fns.defaultClaim {
		fns.claim = e.begin
	}
	switch {
	case fns.execute == nil:
		return Answer{}, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: fmt.Errorf("engine: operation %q has no Execute", op.Name)}
	case !idem.ValidKey(req.Key):
		return Answer{}, idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters, other than \".\" and \"..\".")
	case req.Tenant == "":
		return Answer{}, idem.Errorf(idem.ECodeUnauthenticated, "A tenant is required.")
	case len(req.RequestHashes) == 0 && req.Fingerprint == nil:
		return Answer{}, errNoHash()
	}
	scope := idem.Scope{Tenant: req.Tenant, Operation: op.Name, Key: req.Key}
	f := &fingerprints{raw: req.RawHash, hashes: req.RequestHashes, parse: req.Fingerprint}
	if kept, ok := e.answers.lookup(scope); ok {
		same, err := f.sameCommand(kept.RawHash, kept.RequestHash)
		switch {
		case err != nil:
			return Answer{}, err
		case !same:
			e.reused(ctx, scope)
			return Answer{Outcome: idem.OutcomeConflict}, errKeyReused()
		}
		return Answer{Response: kept.Response, Status: kept.Status, Replayed: true, Outcome: idem.OutcomeReplay}, nil
	}
	hashes, err := f.requestHashes()
	if err != nil {
		return Answer{}, err
	}
	begin := e.beginRequest(op, scope, hashes, e.opts.Owner, e.opts.HomeRegion)
	begin.RawHash = req.RawHash
	// One claim id for every attempt of this request: an attempt after
	// an unknown commit (RetryOn) recognises the record the earlier one
	// stored as its own (idem.BeginRequest.ClaimID).
	begin.ClaimID = rand.Text()
	if fns.defaultClaim {
		// Execute runs as soon as the key is granted: a free key's record
		// says so from its insert, and run writes no CheckpointStarted.
		// (A claim of the operation's own records its own progress.)
		begin.StartAt = CheckpointStarted
	}
	clock := e.opts.Clock
	deadline := clock.Now().Add(min(max(req.Wait, 0), e.opts.MaxWait))
	poll := e.opts.PollMin
	// unknown is the error of an earlier attempt whose outcome is unknown
	// (RetryOn): its write may have committed.
	var unknown error
	for again := 1; ; {
		ans, err := e.attempt(ctx, op, begin, fns)
		if err != nil && req.RetryOn != nil && req.RetryOn(err) && again < MaxAttempts {
			unknown = err
			if clock.Sleep(ctx, time.Duration(again)*50*time.Millisecond) != nil {
				return ans, err
			}
			again++
			continue
		}
		if idem.ErrorCode(err) != idem.ECodeInProgress {
			if idem.ErrorCode(err) == idem.ECodeKeyReused {
				e.reused(ctx, begin.Scope)
			}
			return ans, err
		}
		if unknown != nil {
			// The record in progress may be the one the unknown commit
			// wrote: this request's own, which nothing else executes
			// when its Coordinator or claim does not recognise its claim
			// id. "In progress" would tell the client that another
			// request holds the key; what this request did is unknown,
			// and is answered so (a retry with the same key finds out).
			err = unknown
		}
		left := deadline.Sub(clock.Now())
		if left <= 0 {
			return ans, err
		}
		if serr := clock.Sleep(ctx, min(poll, left)); serr != nil {
			if unknown != nil {
				return ans, unknown
			}
			return ans, errInProgress(serr)
		}
		poll = min(poll*2, e.opts.PollMax)
	}
}

// reused logs a request refused for reusing scope's key with another
// command.
func (e *Engine) reused(ctx context.Context, scope idem.Scope) {
	e.opts.Logger.WarnContext(ctx, "idempotency key reused with a different request",
		"tenant", scope.Tenant, "operation", scope.Operation, "key_hash", telemetry.KeyHash(scope.Key))
}

// funcs are the functions one request runs with: the Operation's, or the
// Request's in their place.
type funcs struct {
	execute, recover ExecuteFunc
	claim            ClaimFunc
	// defaultClaim says claim is the Coordinator's Begin.
	defaultClaim bool
}

// begin is the default ClaimFunc: the Coordinator's Begin.
func (e *Engine) begin(ctx context.Context, req idem.BeginRequest) (Claim, error) {
	d, err := e.coord.Begin(ctx, req)
	return Claim{Decision: d}, err
}

func (e *Engine) beginRequest(op Operation, scope idem.Scope, hashes []string, owner, region string) idem.BeginRequest {
	v := fingerprint.VersionOf(hashes[0])
	if v == 0 {
		v = fingerprint.Version
	}
	return idem.BeginRequest{
		Scope: scope, RequestHashes: hashes, HashVersion: v, Owner: owner, HomeRegion: region,
		LockFor: op.LockFor, Window: op.Window, ExternalFencing: e.opts.Locker != nil,
	}
}

// claim runs the claim and, when the record must be taken over under the
// scope's external lock, takes the lock and claims again with its token.
// The caller releases the returned lock (nil without one). A non-zero
// expect (the recovery worker's) skips, as in progress, a record whose token
// moved since it was listed: another recoverer got there first.
func (e *Engine) claim(ctx context.Context, begin idem.BeginRequest, expect int64, claim ClaimFunc) (Claim, idem.Lock, error) {
	c, err := claim(ctx, begin)
	if err != nil {
		return c, nil, fenced(err)
	}
	d := c.Decision
	if c.Done != nil || d.Outcome != idem.OutcomeRecover || d.Lease.Token != 0 {
		return c, nil, nil
	}
	if expect != 0 && d.Record != nil && d.Record.FencingToken != expect {
		return Claim{Decision: idem.Decision{Outcome: idem.OutcomeInProgress, Record: d.Record}}, nil, nil
	}
	if e.opts.Locker == nil {
		return Claim{}, nil, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.",
			Err: errors.New("engine: the coordinator asked for an external lock but none is configured")}
	}
	lock, err := e.opts.Locker.TryLock(ctx, LockKey(begin.Scope))
	switch {
	case errors.Is(err, idem.ErrLocked):
		return Claim{}, nil, errInProgress(err)
	case err != nil:
		return Claim{}, nil, &idem.Error{Code: idem.ECodeUnavailable, Message: "The recovery lock service is unavailable; retry with the same key.", Err: err}
	}
	if expect != 0 {
		// A recoverer's look before the lock may predate another
		// recoverer's whole takeover (lock, settle, unlock): under the
		// lock, the record must still be the one it listed.
		rec, gerr := e.coord.Get(ctx, begin.Scope)
		if gerr != nil || rec.FencingToken != expect {
			unlock(ctx, lock)
			if gerr != nil && !errors.Is(gerr, idem.ErrRecordNotFound) {
				return Claim{}, nil, gerr
			}
			return Claim{Decision: idem.Decision{Outcome: idem.OutcomeInProgress, Record: rec}}, nil, nil
		}
	}
	begin.FencingToken = lock.Token()
	c, err = claim(ctx, begin)
	if err == nil && c.Done == nil && c.Decision.Outcome == idem.OutcomeRecover && c.Decision.Lease.Token == 0 {
		err = &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: errors.New("engine: takeover with a fencing token granted no lease")}
	}
	if err != nil {
		unlock(ctx, lock)
		return Claim{}, nil, fenced(err)
	}
	return c, lock, nil
}

// fenced turns a rejected takeover or write into "in progress": another
// owner holds the record. An error that already answers in progress is
// kept as it is.
func fenced(err error) error {
	if errors.Is(err, idem.ErrFenced) && idem.ErrorCode(err) != idem.ECodeInProgress {
		return errInProgress(err)
	}
	return err
}

func unlock(ctx context.Context, lock idem.Lock) {
	if lock == nil {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	_ = lock.Unlock(uctx)
}

// attempt runs one claim and whatever it allows, and keeps the answer
// that settled the record in the answer cache if it may.
func (e *Engine) attempt(ctx context.Context, op Operation, begin idem.BeginRequest, fns funcs) (Answer, error) {
	var start time.Time
	if e.answers != nil {
		start = e.opts.Clock.Now()
	}
	c, lock, err := e.claim(ctx, begin, 0, fns.claim)
	if err != nil {
		return Answer{}, err
	}
	defer unlock(ctx, lock)
	if fns.defaultClaim {
		e.answers.claimed(start, c.Decision)
	}
	ans, err := e.decided(ctx, op, begin, fns, c, lock)
	e.answers.keepWritten(ctx, begin, c.Decision, start, ans, err)
	return ans, err
}

// decided does what claim c allows.
func (e *Engine) decided(ctx context.Context, op Operation, begin idem.BeginRequest, fns funcs, c Claim, lock idem.Lock) (Answer, error) {
	var err error
	d := c.Decision
	ans := Answer{Outcome: d.Outcome, ExpiredRetry: d.ExpiredRetry}
	if c.Done != nil {
		return e.stored(ans, op, *c.Done, nil)
	}
	switch d.Outcome {
	case idem.OutcomeReplay:
		if d.Record == nil || d.Record.Response == nil {
			return ans, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: errors.New("engine: replayed record has no response")}
		}
		resp := *d.Record.Response
		if resp.ByReference && op.Replay == nil {
			// A referencing record keeps no body: only its operation can
			// render the answer again.
			return ans, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: errors.New("engine: a referencing record's operation has no Replay")}
		}
		if op.Replay != nil {
			if resp, err = op.Replay(ctx, d.Record); err != nil {
				return ans, err
			}
		}
		ans.Response, ans.Status, ans.Replayed = resp, d.Record.Status, true
		e.answers.keepRead(ctx, begin, d.Record, resp)
		return ans, nil
	case idem.OutcomeConflict:
		return ans, errKeyReused()
	case idem.OutcomeInProgress:
		return ans, errInProgress(nil)
	case idem.OutcomeExecute, idem.OutcomeRecover, idem.OutcomeExpired:
	default:
		return ans, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: fmt.Errorf("engine: unexpected outcome %v", d.Outcome)}
	}
	rec := d.Record
	if rec == nil {
		// A ClaimFunc's insert need not read its record back.
		rec = &idem.Record{Scope: begin.Scope, RequestHash: begin.RequestHashes[0], HashVersion: begin.HashVersion,
			Status: idem.StatusInProgress, Checkpoint: idem.CheckpointReceived, Owner: d.Lease.Owner,
			FencingToken: d.Lease.Token, HomeRegion: begin.HomeRegion}
	}
	a := &Attempt{Lease: d.Lease, Record: rec, Outcome: d.Outcome, coord: e.coord, lock: lock}
	if d.Outcome == idem.OutcomeRecover && rec.Checkpoint != idem.CheckpointReceived {
		if fns.recover == nil {
			e.opts.Logger.WarnContext(ctx, "record needs recovery and its operation has none",
				"tenant", begin.Tenant, "operation", begin.Operation, "key_hash", telemetry.KeyHash(begin.Key), "checkpoint", rec.Checkpoint)
			if err := e.markUnknown(ctx, a, op.UnknownCode); err != nil {
				return ans, err
			}
			ans.Status = idem.StatusUnknown
			return ans, errOutcomeUnknown(op.UnknownCode)
		}
		return e.run(ctx, ans, op, a, fns.recover, false)
	}
	// A claim that wrote progress of its own has started the operation:
	// Execute owns the rest.
	ans.Executed = true
	return e.run(ctx, ans, op, a, fns.execute, c.Progress == "")
}

// run calls fn under a and stores how it ended. start says fn is Execute
// on a record nobody has acted on: CheckpointStarted is written first
// (unless the claim inserted the record at it), and a client already gone
// releases the record before any side effect.
func (e *Engine) run(ctx context.Context, ans Answer, op Operation, a *Attempt, fn ExecuteFunc, start bool) (Answer, error) {
	if start {
		if err := ctx.Err(); err != nil {
			e.release(ctx, a, idem.ECodeUnavailable)
			ans.Status = idem.StatusFailedRetryable
			return ans, err
		}
	}
	if start && a.Record.Checkpoint != CheckpointStarted {
		if err := a.Checkpoint(ctx, CheckpointStarted); err != nil {
			if !errors.Is(err, idem.ErrFenced) {
				e.release(ctx, a, idem.ECodeUnavailable)
			}
			return ans, fenced(err)
		}
	}
	res, err := e.call(ctx, op, a, fn)
	if res.Stored {
		return e.stored(ans, op, res, err)
	}
	// The answer is recorded for the client's retry even if this client
	// has gone.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err != nil {
		switch {
		case errors.Is(err, idem.ErrFenced):
			return ans, fenced(err)
		case idem.ErrorCode(err) == idem.ECodeInProgress:
			// Another owner will finish (Attempt.Check's error): the
			// record is theirs to write.
			return ans, err
		case IsRetryable(err):
			ans.Status = idem.StatusFailedRetryable
			e.release(wctx, a, idem.ErrorCode(err))
		default:
			ans.Status = idem.StatusUnknown
			if werr := e.markUnknown(wctx, a, op.UnknownCode); werr != nil {
				e.opts.Logger.ErrorContext(ctx, "recording an unknown outcome failed", "operation", op.Name, "err", werr)
			}
		}
		return ans, err
	}
	ans.Response, ans.Status, ans.recoveryOutcome = res.Response, res.Status, res.RecoveryOutcome
	var werr error
	switch res.Status {
	case "", idem.StatusCompleted:
		ans.Status = idem.StatusCompleted
		ans.acknowledged, werr = e.complete(wctx, a.Lease, idem.Completion{Response: res.Response, ResourceType: res.ResourceType, ResourceID: res.ResourceID})
	case idem.StatusFailedReplayable:
		resp := res.Response
		ans.acknowledged, werr = e.fail(wctx, a.Lease, idem.Failure{Status: res.Status, ErrorCode: res.ErrorCode, Response: &resp})
	case idem.StatusFailedRetryable:
		werr = e.releaseErr(wctx, a, res.ErrorCode)
	case idem.StatusUnknown:
		code := res.ErrorCode
		if code == "" {
			code = op.UnknownCode
		}
		werr = e.markUnknownErr(wctx, a, code)
	default:
		werr = fmt.Errorf("engine: operation %q returned status %q", op.Name, res.Status)
		ans.Status = idem.StatusUnknown
		if err := e.markUnknownErr(wctx, a, op.UnknownCode); err != nil {
			werr = errors.Join(werr, err)
		}
		return ans, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: werr}
	}
	if werr != nil {
		return ans, fenced(werr)
	}
	return ans, nil
}

// stored answers a Result whose state the operation stored itself
// (Result.Stored, Claim.Done): the engine writes nothing.
func (e *Engine) stored(ans Answer, op Operation, res Result, err error) (Answer, error) {
	ans.Response, ans.Status, ans.recoveryOutcome, ans.Stored = res.Response, res.Status, res.RecoveryOutcome, true
	if err != nil {
		return ans, fenced(err)
	}
	if !storedStatus(res.Status) {
		return ans, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.",
			Err: fmt.Errorf("engine: operation %q stored status %q", op.Name, res.Status)}
	}
	// The operation's own transaction committed, and its commit was
	// answered: a lost answer is an error (Result.Stored).
	ans.acknowledged = true
	return ans, nil
}

// call runs fn with a deadline at the attempt's lock timeout, detached
// from the caller's cancellation: a client that hangs up (its own timeout,
// a dropped connection) cancels nothing it started, so the operation runs
// to its answer, which is stored for the client's retry. A panic
// may come after a side effect, like an unclassified error: the record is
// left UNKNOWN_REQUIRES_RECOVERY at once (what a crash would leave at the
// lock timeout, sooner) and the panic goes on.
func (e *Engine) call(ctx context.Context, op Operation, a *Attempt, fn ExecuteFunc) (res Result, err error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), op.LockFor)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			e.opts.Logger.ErrorContext(ctx, "operation panicked; record left for recovery", "operation", op.Name, "panic", fmt.Sprint(p))
			if err := e.markUnknown(ctx, a, op.UnknownCode); err != nil {
				e.opts.Logger.ErrorContext(ctx, "recording an unknown outcome failed", "operation", op.Name, "err", err)
			}
			panic(p)
		}
	}()
	return fn(cctx, a)
}

// release stores FAILED_RETRYABLE, putting the checkpoint back to RECEIVED
// first so that a takeover executes again. Failures are logged.
func (e *Engine) release(ctx context.Context, a *Attempt, code string) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := e.releaseErr(wctx, a, code); err != nil {
		e.opts.Logger.WarnContext(ctx, "releasing a record failed; it goes stale at its lock timeout", "operation", a.Lease.Operation, "err", err)
	}
}

func (e *Engine) releaseErr(ctx context.Context, a *Attempt, code string) error {
	if err := e.coord.Checkpoint(ctx, a.Lease, idem.CheckpointReceived); err != nil {
		return err
	}
	if code == "" {
		code = idem.ECodeUnavailable
	}
	return e.coord.Fail(ctx, a.Lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: code})
}

func (e *Engine) markUnknown(ctx context.Context, a *Attempt, code string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return fenced(e.markUnknownErr(wctx, a, code))
}

// storedStatus reports whether an operation may report st as the state it
// stored itself (Result.Stored).
func storedStatus(st idem.Status) bool {
	switch st {
	case idem.StatusCompleted, idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown:
		return true
	}
	return false
}

func (e *Engine) markUnknownErr(ctx context.Context, a *Attempt, code string) error {
	if code == "" {
		code = idem.ECodeOutcomeUnknown
	}
	return e.coord.Fail(ctx, a.Lease, idem.Failure{Status: idem.StatusUnknown, ErrorCode: code})
}

package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fencing"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/store"
)

// Defaults of Config.
const (
	DefaultWindow        = 24 * time.Hour
	DefaultLockFor       = 30 * time.Second
	DefaultSchemaVersion = "v2"
	// MaxWait caps a client's Prefer: wait.
	MaxWait = 60 * time.Second
)

// Config configures a Service.
type Config struct {
	// Region is recorded as the home region of new records. Default "local".
	Region string
	// Owner names this process in records it owns. Default: Region.
	Owner string
	// Window is the replay window. Default DefaultWindow (24h).
	Window time.Duration
	// LockFor is how long an owner holds a record before a retry may take it
	// over. Default DefaultLockFor (30s).
	LockFor time.Duration
	// Logger receives conflicts and failures. Default: discard.
	Logger *slog.Logger
	// Sleep waits between polls of an in-progress record; injectable for
	// tests. Default: a context-aware time.Sleep.
	Sleep func(ctx context.Context, d time.Duration) error
	// Provider is the payment provider. Nil runs the local-only operation:
	// record, payment and outbox event commit in one transaction.
	Provider Provider
	// ProviderTimeout bounds one provider call; it must stay well below
	// LockFor so that an owner never outlives its lock. Default LockFor/3.
	ProviderTimeout time.Duration
	// ResponseSchema is the schema new responses are written in: "v2"
	// (default) or "v3".
	ResponseSchema string
	// ReplayRule decides what a replay of a response stored under an older
	// schema looks like: ReplayAsStored (default) or ReconstructCurrent.
	ReplayRule string
	// Locker, when set, fences recovery through an external lock service
	// (etcd): a takeover first locks the scope, and the lock's token is what
	// the record and the provider see. Nil uses the store's own counter.
	Locker Locker
	// OnFenced is called when a write or provider call of this process was
	// rejected because a newer owner holds the record. Optional.
	OnFenced func()
	// Faults are failpoints and deliberately broken engines; they have
	// fields only in builds with -tags failpoints.
	Faults
}

// Service executes create_payment commands.
type Service struct {
	store  *store.Store
	cfg    Config
	logger *slog.Logger
}

// NewService returns a Service over st.
func NewService(st *store.Store, cfg Config) *Service {
	if cfg.Region == "" {
		cfg.Region = "local"
	}
	if cfg.Owner == "" {
		cfg.Owner = cfg.Region
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.LockFor <= 0 {
		cfg.LockFor = DefaultLockFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	if cfg.ProviderTimeout <= 0 {
		cfg.ProviderTimeout = cfg.LockFor / 3
	}
	if cfg.ResponseSchema == "" {
		cfg.ResponseSchema = DefaultSchemaVersion
	}
	if cfg.ReplayRule == "" {
		cfg.ReplayRule = ReplayAsStored
	}
	if cfg.Provider != nil {
		cfg.Provider = tracedProvider{cfg.Provider}
	}
	return &Service{store: st, cfg: cfg, logger: cfg.Logger}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if _, ok := renderers[c.ResponseSchema]; c.ResponseSchema != "" && !ok {
		return fmt.Errorf("payments: unknown response schema %q (want v2 or v3)", c.ResponseSchema)
	}
	switch c.ReplayRule {
	case "", ReplayAsStored, ReconstructCurrent:
	default:
		return fmt.Errorf("payments: unknown replay rule %q (want %s or %s)", c.ReplayRule, ReplayAsStored, ReconstructCurrent)
	}
	return c.Faults.validate()
}

// Window returns the replay window the service publishes.
func (s *Service) Window() time.Duration { return s.cfg.Window }

// Request is one POST /payments call.
type Request struct {
	// Tenant comes from the authenticated principal.
	Tenant string
	// Key is the Idempotency-Key header, already validated.
	Key string
	// Body is the raw request body.
	Body []byte
	// APIVersion is the Api-Version header ("" = DefaultAPIVersion).
	APIVersion string
	// Wait is how long the client asked to wait for an in-progress original
	// (Prefer: wait=N); 0 answers at once.
	Wait time.Duration
	// Uncertain is set when the tenant failed over to this region within the
	// replay window and the old region's records were not handed over: a key
	// unknown here may have been executed there. With a provider, a new claim
	// asks the provider before it charges; without one there is nothing to
	// ask, so a new key is refused (503 IDEMPOTENCY_RECONCILIATION_PENDING)
	// until the handover or the window's end.
	Uncertain bool
}

// Result is the answer to a Request.
type Result struct {
	Response idem.Response
	// Replayed is true when Response is a stored answer.
	Replayed bool
	// Outcome is what the claim decided (for metrics).
	Outcome idem.Outcome
	// ExpiredRetry is true when the key's earlier record had expired and this
	// request became a new operation.
	ExpiredRetry bool
	// Unknown is true when the operation entered UNKNOWN_REQUIRES_RECOVERY.
	Unknown bool
	// ProviderKeyConflict is true when this attempt found that the provider
	// holds another charge under the payment's provider key (and ended the
	// payment CONFLICT). Replays of that answer do not set it.
	ProviderKeyConflict bool
}

// Create executes, replays or refuses a create_payment command. Errors are
// *idem.Error with a stable code (validation, conflict, in progress, duplicate
// merchant reference, store unavailable). No record is written for a command
// that does not parse.
func (s *Service) Create(ctx context.Context, req Request) (Result, error) {
	cmd, err := ParseCommand(req.Body, req.APIVersion)
	if err != nil {
		return Result{}, err
	}
	hashes, err := cmd.Fingerprint()
	if err != nil {
		return Result{}, err
	}
	hashes = s.requestHashes(req.Body, hashes)
	begin := idem.BeginRequest{
		Scope:         idem.Scope{Tenant: req.Tenant, Operation: Operation, Key: req.Key},
		RequestHashes: hashes,
		HashVersion:   fingerprint.Version,
		Owner:         s.cfg.Owner,
		HomeRegion:    s.cfg.Region,
		LockFor:       s.cfg.LockFor,
		Window:        s.cfg.Window,

		ExternalFencing: s.externalFencing(),
	}
	wait := min(req.Wait, MaxWait)
	poll := 20 * time.Millisecond
	unknown := 0
	for {
		res, broken, err := s.attemptBroken(ctx, begin, cmd)
		if !broken {
			res, err = s.withLock(ctx, begin, func(b idem.BeginRequest, lock *fencing.Lock) (Result, error) {
				return s.attempt(ctx, b, cmd, req.Uncertain, lock)
			})
		}
		if errors.Is(err, store.ErrCommitUnknown) && unknown < commitResolveAttempts {
			// The attempt's COMMIT went unanswered: it may have stored
			// the payment. Attempt again: the record answers what the
			// commit did (a replay of the stored answer), or the claim
			// runs afresh.
			unknown++
			if serr := s.cfg.Sleep(ctx, time.Duration(unknown)*50*time.Millisecond); serr != nil {
				return res, err
			}
			continue
		}
		if err == nil || idem.ErrorCode(err) != idem.ECodeInProgress || wait <= 0 {
			return res, err
		}
		d := min(poll, wait)
		if err := s.cfg.Sleep(ctx, d); err != nil {
			return res, &idem.Error{Code: idem.ECodeInProgress, Message: "The original request is still in progress.", Err: err}
		}
		wait -= d
		poll = min(poll*2, 500*time.Millisecond)
	}
}

// commitResolveAttempts bounds how often Create attempts again after a
// COMMIT whose outcome is unknown (store.ErrCommitUnknown).
const commitResolveAttempts = 5

// attempt runs one claim. Without a provider the whole operation is one
// transaction; with one, see attemptWithProvider.
func (s *Service) attempt(ctx context.Context, begin idem.BeginRequest, cmd Command, uncertain bool, lock *fencing.Lock) (Result, error) {
	// A settled record answers from one read; anything else claims below.
	if d, ok, err := s.store.ReadSettled(ctx, begin); err != nil || ok {
		if err != nil {
			return Result{}, err
		}
		res := Result{Outcome: d.Outcome}
		_, err = s.answerExisting(ctx, s.store.Pool(), d, &res)
		return s.finishAttempt(ctx, begin, cmd, res, err)
	}
	if s.cfg.Provider != nil {
		return s.attemptWithProvider(ctx, begin, cmd, uncertain, lock)
	}
	if uncertain {
		if _, err := s.store.Get(ctx, begin.Scope); errors.Is(err, idem.ErrRecordNotFound) {
			return Result{}, idem.Errorf(idem.ECodeReconciliationPending,
				"This tenant moved regions recently and this key may have been used in its old region; retry after the handover.")
		} else if err != nil {
			return Result{}, err
		}
	}
	var res Result
	err := s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		res = Result{}
		p, ev := s.newPayment(begin.Scope, cmd)
		completion, err := s.completion(ctx, tx, p)
		if err != nil {
			return err
		}
		inserted, err := store.ClaimWithPayment(ctx, tx, begin, idem.StatusCompleted, idem.CheckpointCompleted, &completion, p, ev)
		if err != nil {
			return err
		}
		if inserted {
			res = Result{Response: completion.Response, Outcome: idem.OutcomeExecute}
			return nil
		}
		d, err := store.DecideExisting(ctx, tx, begin)
		if err != nil {
			return err
		}
		res.Outcome, res.ExpiredRetry = d.Outcome, d.ExpiredRetry
		if done, err := s.answerExisting(ctx, tx, d, &res); done || err != nil {
			return err
		}
		if d.Lease.Token == 0 {
			return errNeedsLock
		}
		// Recover or Expired: this transaction owns the record now. A
		// recovery finds the payment its earlier owner may have written; a
		// key reused after its window is a new operation, and a payment that
		// already exists for its merchant reference is a duplicate.
		if err := s.insertOwnedPayment(ctx, tx, d, p, ev); err != nil {
			return err
		}
		if completion, err = s.completion(ctx, tx, p); err != nil {
			return err
		}
		if err := store.CompleteTx(ctx, tx, d.Lease, completion); err != nil {
			return err
		}
		res.Response = completion.Response
		return nil
	})
	return s.finishAttempt(ctx, begin, cmd, res, err)
}

// finishAttempt handles what every attempt ends with: a duplicate merchant
// reference becomes a stored business rejection, and a reused key is logged.
func (s *Service) finishAttempt(ctx context.Context, begin idem.BeginRequest, cmd Command, res Result, err error) (Result, error) {
	if errors.Is(err, store.ErrDuplicateMerchantReference) {
		return s.rejectDuplicate(ctx, begin, cmd)
	}
	if idem.ErrorCode(err) == idem.ECodeKeyReused {
		s.logger.WarnContext(ctx, "idempotency key reused with a different request",
			"tenant", begin.Tenant, "operation", begin.Operation, "key_hash", telemetry.KeyHash(begin.Key))
	}
	if errors.Is(err, idem.ErrFenced) {
		s.fenced()
		err = &idem.Error{Code: idem.ECodeInProgress, Message: "Another owner holds this request; retry later.", Err: err}
	}
	return res, err
}

// answerExisting answers from a record this request does not own: a replay,
// a conflict or in progress. It reports done=false when the decision handed
// ownership to this request.
func (s *Service) answerExisting(ctx context.Context, q store.Querier, d idem.Decision, res *Result) (bool, error) {
	switch d.Outcome {
	case idem.OutcomeReplay:
		resp, err := s.replay(ctx, q, d.Record)
		if err != nil {
			return true, err
		}
		res.Response, res.Replayed = resp, true
		return true, nil
	case idem.OutcomeConflict:
		return true, errKeyReused()
	case idem.OutcomeInProgress:
		return true, errInProgress()
	}
	return false, nil
}

func errKeyReused() error {
	return idem.Errorf(idem.ECodeKeyReused, "This idempotency key was already used with a different request.")
}

func errInProgress() error {
	return idem.Errorf(idem.ECodeInProgress, "A request with this idempotency key is still in progress; retry later.")
}

// duplicateResponse is the 409 answer naming the payment that already holds
// the merchant reference.
func duplicateResponse(existingID string) idem.Response {
	body, _ := json.Marshal(struct {
		ErrorCode         string `json:"errorCode"`
		Message           string `json:"message"`
		ExistingPaymentID string `json:"existingPaymentId"`
	}{ECodeDuplicateMerchantRef, "A payment with this merchant reference already exists for the account.", existingID})
	return idem.Response{Status: 409, Headers: map[string]string{"Content-Type": "application/json"}, Body: body, SchemaVersion: DefaultSchemaVersion}
}

// rejectDuplicate answers a command whose merchant reference already has a
// payment (sent with a fresh key): a deterministic business rejection, stored
// as FAILED_REPLAYABLE so that a retry with this key gets the same answer.
// A payment in CONFLICT answers 409 PROVIDER_KEY_CONFLICT instead.
func (s *Service) rejectDuplicate(ctx context.Context, begin idem.BeginRequest, cmd Command) (Result, error) {
	var res Result
	err := s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		existing, err := store.PaymentByMerchantReference(ctx, tx, begin.Tenant, cmd.AccountID, cmd.MerchantReference)
		if err != nil {
			return paymentNotFound(err, "No payment for this merchant reference.")
		}
		resp, code := duplicateResponse(existing.ID), ECodeDuplicateMerchantRef
		if existing.Status == PaymentStatusConflict {
			// The merchant reference's payment ended in a provider key
			// conflict: answer that, not a duplicate naming the very payment
			// this command would create.
			resp, code = providerKeyConflictResponse(existing.ID), ECodeProviderKeyConflict
		}
		d, err := store.BeginTx(ctx, tx, begin)
		if err != nil {
			return err
		}
		res = Result{Outcome: d.Outcome, ExpiredRetry: d.ExpiredRetry}
		switch d.Outcome {
		case idem.OutcomeExecute, idem.OutcomeRecover, idem.OutcomeExpired:
			res.Response = resp
			return store.FailTx(ctx, tx, d.Lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: code, Response: &resp})
		default:
			_, err := s.answerExisting(ctx, tx, d, &res)
			return err
		}
	})
	return res, err
}

// PaymentID derives a payment's id from its business identity: the tenant,
// the account and the merchant reference, which unique(tenant, account,
// merchant_reference) already makes the identity of one payment. Every
// retry, every region and every fresh key for the same business payment
// derives the same id, hence the same provider key, so the provider
// deduplicates a payment that two regions (or a client without stable keys)
// attempt, even when neither can see the other's records.
func PaymentID(tenant, accountID, merchantReference string) string {
	h := sha256.New()
	for _, part := range []string{tenant, accountID, merchantReference} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "pay_" + hex.EncodeToString(h.Sum(nil))[:24]
}

// ProviderKey is the idempotency key the payment provider sees for a payment.
func ProviderKey(paymentID string) string { return "provider_payment_" + paymentID }

func (s *Service) newPayment(scope idem.Scope, cmd Command) (store.Payment, store.Event) {
	id := PaymentID(scope.Tenant, cmd.AccountID, cmd.MerchantReference)
	p := store.Payment{
		Tenant: scope.Tenant, ID: id, AccountID: cmd.AccountID, AmountMinor: cmd.AmountMinor,
		Currency: cmd.Currency, MerchantReference: cmd.MerchantReference, Channel: cmd.Channel,
		Status: "PENDING", ProviderKey: ProviderKey(id),
	}
	return p, *paymentEvent(p, "PaymentCreated", "created", nil)
}

// Get returns the tenant's payment as its current representation.
func (s *Service) Get(ctx context.Context, tenant, id string) ([]byte, error) {
	p, err := store.GetPayment(ctx, s.store.Pool(), tenant, id)
	if err != nil {
		return nil, paymentNotFound(err, "The payment does not exist.")
	}
	return renderers[s.cfg.ResponseSchema](p)
}

// insertOwnedPayment writes the payment of a record this request took over.
func (s *Service) insertOwnedPayment(ctx context.Context, tx store.Querier, d idem.Decision, p store.Payment, ev store.Event) error {
	if d.Outcome == idem.OutcomeExpired {
		return store.InsertPaymentOnly(ctx, tx, p, ev)
	}
	return store.InsertPayment(ctx, tx, p, ev)
}

// fenced reports a rejected write or call of this process.
func (s *Service) fenced() {
	if s.cfg.OnFenced != nil {
		s.cfg.OnFenced()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// paymentNotFound answers store.ErrPaymentNotFound as PAYMENT_NOT_FOUND with
// msg, and returns any other error as is.
func paymentNotFound(err error, msg string) error {
	if errors.Is(err, store.ErrPaymentNotFound) {
		return &idem.Error{Code: ECodePaymentNotFound, Message: msg, Err: err}
	}
	return err
}

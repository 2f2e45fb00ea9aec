package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/ctxtime"
	"github.com/idemcoord/idem/store"
)

// DefaultSchemaVersion is the response schema of Config's default. Its
// window and lock timeout default to the engine's (engine.DefaultWindow,
// engine.DefaultLockFor), so that payments and every other operation of a
// node answer alike.
const DefaultSchemaVersion = "v2"

// Config configures a Service.
type Config struct {
	// Region is recorded as the home region of new records. Default "local".
	Region string
	// Owner names this process in records it owns. Default: Region.
	Owner string
	// Window is the replay window. Default engine.DefaultWindow (24h).
	Window time.Duration
	// LockFor is how long an owner holds a record before a retry may take it
	// over. Default engine.DefaultLockFor (30s).
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
	// StoreBodies stores each 201 answer's headers and body in its record.
	// By default a completed payment's record references the payment and
	// its response schema instead (idem.Response.ByReference), and a replay
	// renders the answer again from the payment, byte for byte: smaller
	// records that hold no copy of the payment. Set it while nodes of a
	// version before referencing records share the store: they replay a
	// referencing record with an empty body.
	StoreBodies bool
	// ClaimOrder says how the claim of a payment starts: ClaimAdaptive
	// (the default) reads a settled record first while retries are most
	// of this service's recent claims (those the answer cache did not
	// answer) and claims first otherwise; ReadFirst and ClaimFirst always
	// do the one (see retryShare). Claiming first is one statement that
	// inserts the record with the payment and its event, or reads the
	// settled record that holds the key; with ClaimAdaptive, while retries
	// are rare, a claim that goes alone reads nothing, and the rare key
	// it finds taken is read after it by the fast path's read.
	ClaimOrder ClaimOrder
	// Locker, when set, fences recovery through an external lock service
	// (etcd): a takeover first locks the scope, and the lock's token is what
	// the record and the provider see. Nil uses the store's own counter.
	Locker Locker
	// OnFenced is called when a write or provider call of this process was
	// rejected because a newer owner holds the record. Optional.
	OnFenced func()
	// AnswerCache keeps the answers of settled payments in memory
	// (engine.Options.AnswerCache): a retry is replayed with no store round
	// trip, a referencing record's answer as it was rendered. Default: off.
	AnswerCache engine.AnswerCache
	// Faults are failpoints and deliberately broken engines; they have
	// fields only in builds with -tags failpoints.
	Faults
}

// ClaimOrder is Config.ClaimOrder.
type ClaimOrder int

// Claim orders.
const (
	// ClaimAdaptive chooses by the share of retries (retryShare).
	ClaimAdaptive ClaimOrder = iota
	// ReadFirst reads a settled record before any insert is attempted: a
	// retry costs one read, a fresh key a read and its claim.
	ReadFirst
	// ClaimFirst attempts the claim first, which reads the record that
	// holds the key in the same statement: a fresh key costs its claim
	// alone, a retry one statement that inserts nothing.
	ClaimFirst
)

// Service executes create_payment commands.
type Service struct {
	store  *store.Store
	cfg    Config
	logger *slog.Logger
	// engine runs Create's requests; its operation is EngineOperation.
	engine *engine.Engine
	// retries chooses whether a claim reads a settled record first.
	retries retryShare
	// claims is the group commit of the one-statement claim.
	claims *store.ClaimOrReadGroup
}

// RetryShare is the share of this service's recent claims whose key was
// settled already (retries, and keys reused for another command), between
// 0 and 1: what ClaimAdaptive chooses by.
func (s *Service) RetryShare() float64 { return s.retries.share() }

// readFirst reports whether the next claim reads a settled record first.
func (s *Service) readFirst() bool {
	switch s.cfg.ClaimOrder {
	case ReadFirst:
		return true
	case ClaimFirst:
		return false
	}
	return s.retries.readFirst()
}

// readInClaim reports whether the next claim that goes alone reads the
// record of a key it finds taken in the same statement: always with
// ClaimFirst or ReadFirst, and with ClaimAdaptive above a small share of
// retries (retryShare.readInClaim).
func (s *Service) readInClaim() bool {
	if s.cfg.ClaimOrder != ClaimAdaptive {
		return true
	}
	return s.retries.readInClaim()
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
		cfg.Window = engine.DefaultWindow
	}
	if cfg.LockFor <= 0 {
		cfg.LockFor = engine.DefaultLockFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Sleep == nil {
		cfg.Sleep = ctxtime.Sleep
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
	s := &Service{store: st, cfg: cfg, logger: cfg.Logger}
	if st != nil {
		// A service without a store only renders and fingerprints (the
		// client-side benchmarks).
		s.claims = newClaimGroup(st)
	}
	opts := s.EngineOptions()
	opts.Clock, opts.MaxWait, opts.AnswerCache = sleepClock{cfg.Sleep}, engine.DefaultMaxWait, cfg.AnswerCache
	s.engine = engine.New(st, opts)
	// A fresh engine has no operation yet, and this one has a name.
	_ = s.engine.Register(s.EngineOperation())
	return s
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
	// status is the record's state an owner stored with this result.
	status idem.Status
}

// Create executes, replays or refuses a create_payment command through the
// engine (engine.Engine.Do), with the request's claim, Execute and Recover
// (see create.go). Errors are *idem.Error with a stable code (validation,
// conflict, in progress, duplicate merchant reference, store unavailable).
// No record is written for a command that does not parse.
func (s *Service) Create(ctx context.Context, req Request) (Result, error) {
	call, err := s.Prepare(req)
	if err != nil {
		return Result{}, err
	}
	ans, err := s.engine.Do(ctx, call.request(req))
	return Result{
		Response: ans.Response, Replayed: ans.Replayed, Outcome: ans.Outcome, ExpiredRetry: ans.ExpiredRetry,
		Unknown: call.Unknown() && !ans.Replayed, ProviderKeyConflict: call.ProviderKeyConflict() && !ans.Replayed,
	}, err
}

// Engine is the engine that runs the service's requests, with its
// operation (EngineOperation) registered: a caller that drives a Call
// itself (the idempotency middleware) runs it there.
func (s *Service) Engine() *engine.Engine { return s.engine }

// Store is the store the service keeps its payments, records and outbox in.
func (s *Service) Store() *store.Store { return s.store }

// duplicateResponse is the 409 answer naming the payment that already holds
// the merchant reference.
func duplicateResponse(existingID string) idem.Response {
	resp := problemResponse(ECodeDuplicateMerchantRef, "A payment with this merchant reference already exists for the account.",
		paymentProblem{ExistingPaymentID: existingID})
	resp.SchemaVersion = DefaultSchemaVersion
	return resp
}

// rejectDuplicate answers a command whose merchant reference already has a
// payment (sent with a fresh key): a deterministic business rejection, stored
// as FAILED_REPLAYABLE in the claim's own transaction, so that a retry with
// this key gets the same answer. A payment in CONFLICT answers 409
// PROVIDER_KEY_CONFLICT instead. Any other decision (replay, conflict, in
// progress, a takeover that needs the scope's lock) goes back to the engine.
//
// After a region failover, before the handover (uncertain), the payment
// here may have been written by another key that found the charge this key
// made in the old region: when the provider's charge carries this key's
// reference (ChargeReference), this key made the payment and is answered as
// its creator was, 201 with the payment, not 409.
func (c *createCall) rejectDuplicate(ctx context.Context, begin idem.BeginRequest) (engine.Claim, error) {
	s, cmd := c.s, c.cmd
	creator := false
	if c.uncertain && s.cfg.Provider != nil {
		ch, err := s.lookup(ctx, c.payment.ProviderKey)
		creator = err == nil && ch.Reference == ChargeReference(begin.Scope) &&
			ch.AmountMinor == c.payment.AmountMinor && ch.Currency == c.payment.Currency
	}
	var cl engine.Claim
	err := s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		cl = engine.Claim{}
		existing, err := PaymentByMerchantReference(ctx, tx, begin.Tenant, cmd.AccountID, cmd.MerchantReference)
		if err != nil {
			return paymentNotFound(err, "No payment for this merchant reference.")
		}
		if creator && existing.ID == c.payment.ID && existing.Status != PaymentStatusConflict {
			d, err := store.ClaimTx(ctx, tx, begin)
			if err != nil || !owned(d) {
				cl.Decision = d
				return err
			}
			// The answer the old region gave this key: the payment as
			// created (rendered from the command, as it was then).
			completion, err := s.completion(ctx, tx, c.payment)
			if err != nil {
				return err
			}
			cl = engine.Claim{Decision: d, Done: &engine.Result{Stored: true, Status: idem.StatusCompleted, Response: completion.Response}}
			return store.CompleteTx(ctx, tx, d.Lease, completion)
		}
		resp, code := duplicateResponse(existing.ID), ECodeDuplicateMerchantRef
		if existing.Status == PaymentStatusConflict {
			// The merchant reference's payment ended in a provider key
			// conflict: answer that, not a duplicate naming the very payment
			// this command would create.
			resp, code = providerKeyConflictResponse(existing.ID), ECodeProviderKeyConflict
		}
		d, err := store.ClaimTx(ctx, tx, begin)
		if err != nil {
			return err
		}
		cl.Decision = d
		if !owned(d) {
			return nil
		}
		cl.Done = &engine.Result{Stored: true, Status: idem.StatusFailedReplayable, Response: resp}
		return store.FailTx(ctx, tx, d.Lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: code, Response: &resp})
	})
	return cl, err
}

// ChargeReference is the reference a payment's charge carries at the
// provider (provider.ChargeRequest.Reference): a digest of the scope of the
// record that made the charge (tenant, operation, the client's key; the key
// itself never leaves). A region that finds the charge later, after a
// failover, tells by it whether the key in hand made the payment (a retry:
// answered as the payment's creator) or another key did (a duplicate: 409
// DUPLICATE_MERCHANT_REFERENCE, as the old region would have answered).
func ChargeReference(scope idem.Scope) string {
	h := sha256.New()
	for _, part := range []string{scope.Tenant, scope.Operation, scope.Key} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "ref_" + hex.EncodeToString(h.Sum(nil))[:32]
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

func (s *Service) newPayment(scope idem.Scope, cmd Command) (Payment, Event) {
	id := PaymentID(scope.Tenant, cmd.AccountID, cmd.MerchantReference)
	p := Payment{
		Tenant: scope.Tenant, ID: id, AccountID: cmd.AccountID, AmountMinor: cmd.AmountMinor,
		Currency: cmd.Currency, MerchantReference: cmd.MerchantReference, Channel: cmd.Channel,
		Status: PaymentStatusPending, ProviderKey: ProviderKey(id),
	}
	return p, *paymentEvent(p, "PaymentCreated", "created", nil)
}

// Get returns the tenant's payment as its current representation.
func (s *Service) Get(ctx context.Context, tenant, id string) ([]byte, error) {
	p, err := s.getPayment(ctx, tenant, id)
	if err != nil {
		return nil, paymentNotFound(err, "The payment does not exist.")
	}
	return render(s.cfg.ResponseSchema, p)
}

// insertOwnedPayment writes the payment of a record this request took over.
func (s *Service) insertOwnedPayment(ctx context.Context, tx store.Querier, d idem.Decision, p Payment, ev Event) error {
	if d.Outcome == idem.OutcomeExpired {
		return InsertPaymentOnly(ctx, tx, p, ev)
	}
	return InsertPayment(ctx, tx, p, ev)
}

// fenced reports a rejected write or call of this process.
func (s *Service) fenced() {
	if s.cfg.OnFenced != nil {
		s.cfg.OnFenced()
	}
}

// sleepClock is the engine's clock over Config.Sleep.
type sleepClock struct {
	sleep func(ctx context.Context, d time.Duration) error
}

func (sleepClock) Now() time.Time { return time.Now() }

func (c sleepClock) Sleep(ctx context.Context, d time.Duration) error { return c.sleep(ctx, d) }

// paymentNotFound answers ErrPaymentNotFound as PAYMENT_NOT_FOUND with
// msg, and returns any other error as is.
func paymentNotFound(err error, msg string) error {
	if errors.Is(err, ErrPaymentNotFound) {
		return &idem.Error{Code: ECodePaymentNotFound, Message: msg, Err: err}
	}
	return err
}

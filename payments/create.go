package payments

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/store"
)

// createCall is one Create request as the engine runs it: its claim, its
// Execute and its Recover, bound to the request's command.
//
//   - The claim (engine.ClaimFunc) answers a settled record from one read
//     (readSettled, store.ReadSettledWith: a referencing record's answer is rendered
//     from the payment that read joins), then claims the key in the statement that
//     writes the payment row and its PaymentCreated event
//     (ClaimWithPayment). Without a provider that statement also
//     completes the record: record, payment and event commit in one
//     transaction (engine.Claim.Done), for a free key the statement alone
//     as a transaction of its own, one round trip (claimOne). With one, the record is claimed at
//     LOCAL_PAYMENT_CREATED (engine.Claim.Progress) and Execute charges.
//     A record taken over at RECEIVED (a key reused after its window) gets
//     its payment in the claim's transaction too.
//   - Execute and Recover drive the payment to the provider and record the
//     result themselves, in one transaction with the payment's status and
//     outbox event (engine.Result.Stored). A client's retry that takes a
//     record over past RECEIVED resumes from its checkpoint: at
//     LOCAL_PAYMENT_CREATED it charges, later it asks the provider first.
//     The recovery worker (EngineOperation's Recover, Attempt.Background)
//     never charges a payment the provider has not seen.
type createCall struct {
	s         *Service
	cmd       Command
	payment   Payment
	event     Event
	uncertain bool
	// plain says the last claim statement was the plain claim, which
	// reads nothing when the key is taken (claimStatement).
	plain bool
	// What the last Execute or Recover learnt, for Result.
	unknown, keyConflict bool
}

// Call is one create_payment request bound to its command, for a caller
// that runs it through the engine itself, as the node's HTTP route does
// through the idempotency middleware (idemhttp.Hooks.Command): the
// request's raw hash and the command's fingerprint, the claim that writes
// the payment with the record, the Recover of a client's takeover, and the
// Execute that charges. A Call serves one request (and its attempts after
// an ambiguous commit); it is not safe for concurrent use.
type Call struct {
	c          *createCall
	body       []byte
	apiVersion string
	raw        string
	// parsed says the command was parsed (into c.cmd, hashes) or failed
	// to (err): a Call parses once, and only when the engine asks.
	parsed bool
	hashes []string
	err    error
}

// Prepare binds req's command (Body, APIVersion) with req.Uncertain into a
// Call; req's Tenant, Key and Wait are the engine request's, not the
// Call's. It checks the Api-Version and computes the request's raw hash
// (RawHash), and parses the body only when the engine needs the command
// (Hashes): a retry with the bytes and Api-Version of the request that
// settled its key, answered from memory, is never parsed. Errors are
// Create's, from Prepare or from Hashes: nothing is stored for a command
// that does not parse.
func (s *Service) Prepare(req Request) (*Call, error) {
	apiVersion := req.APIVersion
	if apiVersion == "" {
		apiVersion = DefaultAPIVersion
	}
	if !validAPIVersion(apiVersion) {
		return nil, errAPIVersion()
	}
	return &Call{c: &createCall{s: s, uncertain: req.Uncertain}, body: req.Body, apiVersion: req.APIVersion,
		raw: rawHash(req.Body, apiVersion)}, nil
}

// rawHash is the raw hash of a body sent under apiVersion: ParseCommand
// reads nothing else, and the operation's name is in the hash.
func rawHash(body []byte, apiVersion string) string {
	return fingerprint.RawHash(Operation, body, "Api-Version", apiVersion)
}

// RawHash is the request's raw hash (engine.Request.RawHash).
func (c *Call) RawHash() string { return c.raw }

// Hashes parses the command, once, and returns its request hashes
// (engine.Request.Fingerprint), or the error that answers a command that
// does not parse.
func (c *Call) Hashes() ([]string, error) {
	if !c.parsed {
		c.parsed = true
		c.c.cmd, c.err = ParseCommand(c.body, c.apiVersion)
		if c.err == nil {
			var hashes []string
			hashes, c.err = c.c.cmd.Fingerprint()
			c.hashes = c.c.s.requestHashes(c.body, hashes)
		}
	}
	return c.hashes, c.err
}

// Claim claims the key together with the payment (engine.Request.Claim).
// The engine has parsed the command by then (Hashes).
func (c *Call) Claim(ctx context.Context, begin idem.BeginRequest) (engine.Claim, error) {
	if _, err := c.Hashes(); err != nil {
		return engine.Claim{}, err
	}
	return c.c.claimFunc()(ctx, begin)
}

// Execute charges the payment the claim wrote (engine.Request.Execute). Its
// Result is always Stored: the payment's status, its event and the record
// commit together.
func (c *Call) Execute(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	return c.c.execute(ctx, a)
}

// Recover resumes a record a client's retry took over past RECEIVED
// (engine.Request.Recover).
func (c *Call) Recover(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	return c.c.recover(ctx, a)
}

// Unknown reports whether the last Execute or Recover left the payment's
// outcome unknown; ProviderKeyConflict whether it found another charge
// under the payment's provider key (for metrics).
func (c *Call) Unknown() bool             { return c.c.unknown }
func (c *Call) ProviderKeyConflict() bool { return c.c.keyConflict }

// Request is the engine request of call for req (its tenant, key and wait).
func (c *Call) request(req Request) engine.Request {
	return engine.Request{
		Operation: Operation, Tenant: req.Tenant, Key: req.Key, RawHash: c.raw, Fingerprint: c.Hashes, Wait: req.Wait,
		Claim: c.Claim, Recover: c.Recover, Execute: c.Execute, RetryOn: CommitUnknown,
	}
}

// CommitUnknown reports a COMMIT whose answer was lost
// (store.ErrCommitUnknown): it may have stored the payment, so the request
// is attempted again (engine.Request.RetryOn), and the record answers what
// the commit did (a replay of the stored answer), or the claim runs
// afresh.
func CommitUnknown(err error) bool {
	return errors.Is(err, store.ErrCommitUnknown)
}

// owned reports whether d hands the record to this request.
func owned(d idem.Decision) bool {
	switch d.Outcome {
	case idem.OutcomeExecute, idem.OutcomeRecover, idem.OutcomeExpired:
		return d.Lease.Token != 0
	}
	return false
}

// settled is the claim of a request a settled record decided (a replay or
// a conflict), as read with the payment p a referencing record renders its
// answer from (nil when it references none), or err.
func (s *Service) settled(ctx context.Context, d idem.Decision, p *Payment, err error) (engine.Claim, error) {
	if err != nil || p == nil || d.Outcome != idem.OutcomeReplay {
		return engine.Claim{Decision: d}, err
	}
	resp, err := s.replay(ctx, d.Record, p)
	if err != nil {
		return engine.Claim{}, err
	}
	d.Record.Response = &resp
	return engine.Claim{Decision: d}, nil
}

// claim is the request's engine.ClaimFunc.
func (c *createCall) claim(ctx context.Context, begin idem.BeginRequest) (engine.Claim, error) {
	s := c.s
	// While retries are most of what a node sees, a settled record
	// answers from one read (with the payment a referencing record renders
	// from), before any insert is attempted; otherwise the claim below
	// reads it when it finds the key taken (retryShare).
	if s.readFirst() {
		d, p, ok, err := readSettled(ctx, s.store, begin)
		if err != nil || ok {
			if err == nil {
				s.retries.observe(true)
			}
			return s.settled(ctx, d, p, err)
		}
	}
	if c.uncertain && s.cfg.Provider == nil {
		// Nothing to ask whether the old region executed a key unknown
		// here: refuse it until the handover or the window's end.
		if _, err := s.store.Get(ctx, begin.Scope); errors.Is(err, idem.ErrRecordNotFound) {
			return engine.Claim{}, idem.Errorf(idem.ECodeReconciliationPending,
				"This tenant moved regions recently and this key may have been used in its old region; retry after the handover.")
		} else if err != nil {
			return engine.Claim{}, err
		}
	}
	// The payment is derived from the command (same id, same provider key
	// in every attempt); a replay above never needs it.
	c.payment, c.event = s.newPayment(begin.Scope, c.cmd)
	var (
		cl          engine.Claim
		done, taken bool
		err         error
	)
	cl, done, taken, err = c.claimOne(ctx, begin)
	if err == nil && !done && taken && c.plain {
		// The plain claim found the key taken and read nothing: the
		// fast path's read answers a settled record (a retry, rare while
		// the claim is plain) with the payment it references.
		d, p, ok, err := readSettled(ctx, s.store, begin)
		if err != nil || ok {
			if err == nil {
				s.retries.observe(true)
			}
			return s.settled(ctx, d, p, err)
		}
	}
	if err == nil && !done {
		err = s.store.ExecTx(ctx, func(tx pgx.Tx) (err error) {
			if s.cfg.Provider == nil {
				cl, err = c.claimLocal(ctx, tx, begin, taken)
			} else {
				cl, err = c.claimForProvider(ctx, tx, begin, taken)
			}
			return err
		})
		if err == nil && taken {
			// The claim found the key taken and did not decide: a plain
			// claim's retry is counted here, where it is answered.
			s.retries.observe(settledOutcome(cl.Decision.Outcome))
		}
	}
	switch {
	case errors.Is(err, ErrDuplicateMerchantReference):
		// Another key already made this business payment.
		return c.rejectDuplicate(ctx, begin)
	case errors.Is(err, idem.ErrFenced):
		s.fenced()
	}
	return cl, err
}

// claimOne is the common case, a free key or a settled one, in one round
// trip: the claim statement (claimOrReplay) alone, as a transaction of its
// own (store.Store.ExecOne), writes the record with the payment and its
// event, or reads the settled record that holds the key (a replay or a
// conflict, answered from that read). Without a provider the record is
// written COMPLETED; with one, IN_PROGRESS at LOCAL_PAYMENT_CREATED for
// Execute to charge (claimOneForProvider). done is false when the key's
// record is not settled (the statement wrote nothing; taken is then
// true): claimLocal or claimForProvider then decides in a transaction. A
// referencing record stores no body, so the answer is rendered after the
// statement, with the creation time it returns; with Config.StoreBodies, a
// schema that shows the creation time needs it before the insert, and
// goes to claimLocal.
func (c *createCall) claimOne(ctx context.Context, begin idem.BeginRequest) (cl engine.Claim, done, taken bool, err error) {
	s, p := c.s, c.payment
	if s.cfg.Provider != nil {
		return c.claimOneForProvider(ctx, begin)
	}
	completion := idem.Completion{Response: idem.Response{Status: 201, SchemaVersion: s.cfg.ResponseSchema, ByReference: true},
		ResourceType: "payment", ResourceID: p.ID}
	if s.cfg.StoreBodies {
		if showsCreationTime(s.cfg.ResponseSchema) {
			return engine.Claim{}, false, false, nil
		}
		if completion, err = s.completion(ctx, nil, p); err != nil {
			return engine.Claim{}, false, false, err
		}
	}
	var (
		out     store.ClaimOrRead
		settled *Payment
	)
	out, settled, err = c.claimStatement(ctx, begin, idem.StatusCompleted, idem.CheckpointCompleted, &completion)
	if err == nil && out.Settled {
		cl, err = s.settled(ctx, out.Decision, settled, nil)
		return cl, err == nil, false, err
	}
	if err != nil || !out.Inserted {
		return engine.Claim{}, false, err == nil, err
	}
	resp := completion.Response
	if resp.ByReference {
		p.CreatedAt = out.At
		if resp, err = created(s.cfg.ResponseSchema, p); err != nil {
			return engine.Claim{}, false, false, err
		}
		resp.ByReference = true
	}
	return engine.Claim{Decision: idem.Decision{Outcome: idem.OutcomeExecute},
		Done: &engine.Result{Stored: true, Status: idem.StatusCompleted, Response: resp}}, true, false, nil
}

// claimStatement sends the one-statement claim of the payment and its
// event, the record in state status at checkpoint cp (with completion's
// answer when it is not nil): claimOrReplay, in a batch with the claims of
// concurrent requests when some are in flight (alone, it reads nothing
// while retries are rare: Service.readInClaim; c.plain says so, and claim
// then reads a key it found taken with the fast path's read), or with the
// store's NoReplayRead, ClaimWithPayment alone (it reads nothing when the
// key is taken). It counts the claim in the retry share when the
// statement decided it.
func (c *createCall) claimStatement(ctx context.Context, begin idem.BeginRequest, status idem.Status, cp idem.Checkpoint,
	completion *idem.Completion) (out store.ClaimOrRead, settled *Payment, err error) {
	s := c.s
	c.plain = false
	if s.store.ReplayRead() {
		read := s.readInClaim()
		c.plain = !read
		out, settled, err = claimOrReplay(ctx, s.claims, read, begin, status, cp, completion, c.payment, c.event)
	} else {
		err = s.store.ExecOne(ctx, func(q store.Querier) (err error) {
			out = store.ClaimOrRead{}
			out.Inserted, out.At, err = ClaimWithPayment(ctx, q, begin, status, cp, completion, c.payment, c.event)
			return err
		})
	}
	if err == nil && (out.Inserted || out.Settled) {
		// A key found taken and not decided is counted once the
		// transaction decides (claim).
		s.retries.observe(out.Settled)
	}
	return out, settled, err
}

// settledOutcome reports whether a claim's outcome was decided by a
// settled record: a replay or a conflict, what retryShare counts.
func settledOutcome(o idem.Outcome) bool {
	return o == idem.OutcomeReplay || o == idem.OutcomeConflict
}

// claimLocal is the local-only operation: one transaction claims the key
// and writes the completed record, the payment and its event; a record it
// takes over (a key reused after its window, a recovery) gets its payment
// and completion in the same transaction.
//
// taken says claimOne just found the key's record: the transaction decides
// from it first, and claims the key only if the record has gone since
// (cleanup), instead of attempting the insert a second time.
func (c *createCall) claimLocal(ctx context.Context, tx pgx.Tx, begin idem.BeginRequest, taken bool) (engine.Claim, error) {
	s, p := c.s, c.payment
	if !taken {
		completion, err := s.completion(ctx, tx, p)
		if err != nil {
			return engine.Claim{}, err
		}
		inserted, _, err := ClaimWithPayment(ctx, tx, begin, idem.StatusCompleted, idem.CheckpointCompleted, &completion, p, c.event)
		if err != nil {
			return engine.Claim{}, err
		}
		if inserted {
			return engine.Claim{Decision: idem.Decision{Outcome: idem.OutcomeExecute},
				Done: &engine.Result{Stored: true, Status: idem.StatusCompleted, Response: completion.Response}}, nil
		}
	}
	d, err := store.DecideExisting(ctx, tx, begin)
	if taken && errors.Is(err, pgx.ErrNoRows) {
		return c.claimLocal(ctx, tx, begin, false)
	}
	if err != nil || !owned(d) {
		return engine.Claim{Decision: d}, err
	}
	// Recover or Expired: this transaction owns the record now. A
	// recovery finds the payment its earlier owner may have written; a key
	// reused after its window is a new operation, and a payment that
	// already exists for its merchant reference is a duplicate.
	if err := s.insertOwnedPayment(ctx, tx, d, p, c.event); err != nil {
		return engine.Claim{}, err
	}
	completion, err := s.completion(ctx, tx, p)
	if err != nil {
		return engine.Claim{}, err
	}
	if err := store.CompleteTx(ctx, tx, d.Lease, completion); err != nil {
		return engine.Claim{}, err
	}
	return engine.Claim{Decision: d, Done: &engine.Result{Stored: true, Status: idem.StatusCompleted, Response: completion.Response}}, nil
}

// claimOneForProvider is claimOne with a provider: the record is claimed
// IN_PROGRESS at LOCAL_PAYMENT_CREATED with the payment and its event, for
// Execute to charge, or the settled record that holds the key answers.
func (c *createCall) claimOneForProvider(ctx context.Context, begin idem.BeginRequest) (cl engine.Claim, done, taken bool, err error) {
	s := c.s
	var (
		out     store.ClaimOrRead
		settled *Payment
	)
	out, settled, err = c.claimStatement(ctx, begin, idem.StatusInProgress, CheckpointLocalPaymentCreated, nil)
	switch {
	case err != nil:
		return engine.Claim{}, false, false, err
	case out.Settled:
		cl, err = s.settled(ctx, out.Decision, settled, nil)
		return cl, err == nil, false, err
	case out.Inserted:
		return providerClaim(begin), true, false, nil
	}
	return engine.Claim{}, false, true, nil
}

// providerClaim is the claim of a record this request inserted at
// LOCAL_PAYMENT_CREATED: its first lease, for Execute to charge.
func providerClaim(begin idem.BeginRequest) engine.Claim {
	lease := idem.Lease{Scope: begin.Scope, Token: 1, Owner: begin.Owner}
	return engine.Claim{Decision: idem.Decision{Outcome: idem.OutcomeExecute, Lease: lease}, Progress: CheckpointLocalPaymentCreated}
}

// claimForProvider claims the key together with the payment row and its
// event, at checkpoint LOCAL_PAYMENT_CREATED, for Execute to charge, or
// decides on the record that holds it (taken says claimOneForProvider just
// found one: the insert is not attempted again unless it has gone). A
// record taken over past RECEIVED is left as it is for Recover.
func (c *createCall) claimForProvider(ctx context.Context, tx pgx.Tx, begin idem.BeginRequest, taken bool) (engine.Claim, error) {
	// This request's claim inserts its record at LOCAL_PAYMENT_CREATED:
	// one found there under its claim id (an earlier attempt's claim
	// whose commit went unanswered, begin.ClaimID) is handed back as
	// inserted (store.DecideExisting).
	begin.StartAt = CheckpointLocalPaymentCreated
	if !taken {
		inserted, _, err := ClaimWithPayment(ctx, tx, begin, idem.StatusInProgress, CheckpointLocalPaymentCreated, nil, c.payment, c.event)
		if err != nil {
			return engine.Claim{}, err
		}
		if inserted {
			return providerClaim(begin), nil
		}
	}
	d, err := store.DecideExisting(ctx, tx, begin)
	if taken && errors.Is(err, pgx.ErrNoRows) {
		return c.claimForProvider(ctx, tx, begin, false)
	}
	if err == nil && d.Outcome == idem.OutcomeExecute && owned(d) {
		// This request's own record, as its claim inserted it: Execute
		// charges, as after providerClaim.
		return engine.Claim{Decision: d, Progress: CheckpointLocalPaymentCreated}, nil
	}
	if err != nil || !owned(d) || d.Record.Checkpoint != idem.CheckpointReceived {
		return engine.Claim{Decision: d}, err
	}
	if err := c.s.insertOwnedPayment(ctx, tx, d, c.payment, c.event); err != nil {
		return engine.Claim{}, err
	}
	return engine.Claim{Decision: d, Progress: CheckpointLocalPaymentCreated},
		store.CheckpointTx(ctx, tx, d.Lease, CheckpointLocalPaymentCreated, 0)
}

// execute charges the payment the claim wrote. When uncertain (see
// Request.Uncertain), a new claim asks the provider first, as a takeover
// past PROVIDER_REQUEST_SENT would, so a charge the old region made is
// found, not repeated.
func (c *createCall) execute(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	cp := CheckpointLocalPaymentCreated
	if c.uncertain && a.Outcome == idem.OutcomeExecute {
		cp = CheckpointProviderRequestSent
	}
	return c.drive(ctx, a, cp)
}

// recover resumes a record a client's retry took over past RECEIVED, from
// its checkpoint.
func (c *createCall) recover(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	return c.drive(ctx, a, a.Record.Checkpoint)
}

func (c *createCall) drive(ctx context.Context, a *engine.Attempt, cp idem.Checkpoint) (engine.Result, error) {
	res, err := c.s.settle(ctx, a, cp, c.payment)
	c.unknown, c.keyConflict = res.Unknown, res.ProviderKeyConflict
	return engine.Result{Stored: true, Status: res.status, Response: res.Response}, err
}

// settle drives an owned payment from checkpoint cp to a recorded result
// (see drive). The recovery worker (a.Background) never charges a payment
// the provider was never asked for: it releases the key for the client's
// retry instead.
func (s *Service) settle(ctx context.Context, a *engine.Attempt, cp idem.Checkpoint, p Payment) (Result, error) {
	if a.Background && cp == CheckpointLocalPaymentCreated {
		return Result{status: idem.StatusFailedRetryable}, s.release(ctx, a.Lease)
	}
	var guard func() error
	if a.Locked() {
		guard = a.Check
	}
	return s.drive(ctx, a.Lease, cp, p, guard)
}

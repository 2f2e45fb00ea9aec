package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/store"
)

// Recovery outcomes, the label values of the recovery metric.
const (
	// RecoveryCompleted: the provider had charged; the record is COMPLETED.
	RecoveryCompleted = "completed"
	// RecoveryReleased: the provider was never called (or answered that it
	// is unavailable); the record is FAILED_RETRYABLE, so the client's next
	// retry executes again with the same payment and provider key.
	RecoveryReleased = "released"
	// RecoveryDeclined: the provider remembers a decline for the key.
	RecoveryDeclined = "declined"
	// RecoveryUnknown: the provider could not be asked; the record stays
	// UNKNOWN_REQUIRES_RECOVERY for the next pass.
	RecoveryUnknown = "unknown"
	// RecoverySkipped: another owner took the record first.
	RecoverySkipped = "skipped"
	// RecoveryConflict: the provider holds another charge under the
	// payment's provider key; the payment is CONFLICT (see
	// PaymentStatusConflict).
	RecoveryConflict = "conflict"
)

// RecoveryOutcomes are every outcome RecoverBatch reports.
var RecoveryOutcomes = []string{RecoveryCompleted, RecoveryReleased, RecoveryDeclined, RecoveryUnknown, RecoverySkipped, RecoveryConflict}

// EngineOperation is create_payment as an operation of the engine: its
// replay window, lock timeout, unknown-outcome code
// (PAYMENT_OUTCOME_UNKNOWN) and, with a provider, its Recover, which asks
// the provider before it charges again (see RecoverBatch). The node's
// recovery worker runs it through the engine (engine.RecoverStale) with
// every other registered operation's. Requests themselves go through
// Create, which claims the record together with the payment row (or, with
// no provider, writes record, payment and outbox event in one statement),
// which the engine's generic claim cannot do.
func (s *Service) EngineOperation() engine.Operation {
	op := engine.Operation{Name: Operation, Window: s.cfg.Window, LockTimeout: s.cfg.LockFor, UnknownCode: ECodeOutcomeUnknown}
	if s.cfg.Provider != nil {
		op.Recover = s.recoverAttempt
	}
	return op
}

// EngineOptions are the engine options that match the service's: its owner,
// region, logger and (unless a broken engine ignores fencing) its Locker.
func (s *Service) EngineOptions() engine.Options {
	opts := engine.Options{Owner: s.cfg.Owner, HomeRegion: s.cfg.Region, Logger: s.logger}
	if s.externalFencing() {
		opts.Locker = s.cfg.Locker
	}
	return opts
}

// RecoverBatch reconciles up to limit stale create_payment records that no
// client is retrying, through an engine of its own (engine.RecoverStale):
// it takes recovery ownership of each (atomically, fenced, exactly as a
// retry would), asks the provider by provider key, and records what it
// learns. A record that had reached PROVIDER_REQUEST_SENT and has no charge
// at the provider is charged again with the same provider key (the provider
// deduplicates it); a record that never reached the provider is released
// for the client's retry. It returns how many records ended in each
// outcome (RecoveryOutcomes).
func (s *Service) RecoverBatch(ctx context.Context, limit int) (map[string]int, error) {
	if s.cfg.Provider == nil {
		return nil, nil
	}
	e := engine.New(s.store, s.EngineOptions())
	if err := e.Register(s.EngineOperation()); err != nil {
		return nil, err
	}
	return e.RecoverStale(ctx, limit)
}

// recoverAttempt is create_payment's engine Recover: it settles a record
// taken over past RECEIVED and writes the outcome itself, in one
// transaction with the payment's status and outbox event.
func (s *Service) recoverAttempt(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	var guard func() error
	if a.Locked() {
		guard = a.Check
	}
	outcome, err := s.recoverOwned(ctx, idem.Decision{Outcome: idem.OutcomeRecover, Lease: a.Lease, Record: a.Record}, guard)
	if err != nil {
		return engine.Result{}, err
	}
	res := engine.Result{Stored: true, RecoveryOutcome: outcome}
	switch outcome {
	case RecoveryCompleted:
		res.Status = idem.StatusCompleted
	case RecoveryDeclined, RecoveryConflict:
		res.Status = idem.StatusFailedReplayable
	case RecoveryReleased:
		res.Status = idem.StatusFailedRetryable
	case RecoveryUnknown:
		res.Status = idem.StatusUnknown
	default: // RecoverySkipped: a newer owner holds the record.
		return engine.Result{}, fmt.Errorf("payments: recovery: %w", idem.ErrFenced)
	}
	return res, nil
}

// recoverOwned finishes a record this worker owns (d.Lease).
// guard, when set, checks the scope's external lock before a side effect.
func (s *Service) recoverOwned(ctx context.Context, d idem.Decision, guard func() error) (string, error) {
	rec := d.Record
	lease := d.Lease
	if d.Record.ResourceID == "" {
		// Claimed but no payment was ever written: nothing happened downstream.
		return RecoveryReleased, s.release(ctx, lease)
	}
	p, err := store.GetPayment(ctx, s.store.Pool(), rec.Tenant, d.Record.ResourceID)
	if err != nil {
		if errors.Is(err, store.ErrPaymentNotFound) {
			return RecoveryReleased, s.release(ctx, lease)
		}
		return "", err
	}
	if d.Record.Checkpoint == CheckpointLocalPaymentCreated {
		// The provider was never called: release the key for the client's
		// retry rather than charge without the client.
		return RecoveryReleased, s.release(ctx, lease)
	}
	// The request reached (or may have reached) the provider: ask it, and
	// finish with the same provider key if it has no charge.
	res, err := s.drive(ctx, lease, d.Record.Checkpoint, p, guard)
	switch {
	case idem.ErrorCode(err) == ECodeProviderUnavailable:
		return RecoveryReleased, nil
	case idem.ErrorCode(err) == idem.ECodeInProgress:
		return RecoverySkipped, nil
	case err != nil:
		return "", err
	case res.Unknown:
		return RecoveryUnknown, nil
	case res.ProviderKeyConflict:
		return RecoveryConflict, nil
	case res.Response.Status == 402:
		return RecoveryDeclined, nil
	}
	return RecoveryCompleted, nil
}

// release marks an owned record FAILED_RETRYABLE: nothing was charged.
func (s *Service) release(ctx context.Context, lease idem.Lease) error {
	return s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		return store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: ECodeProviderUnavailable})
	})
}

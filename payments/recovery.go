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

// Recovery outcomes, the label values of the recovery metric: the
// engine's (engine.RecoveryCompleted and the rest), as payments reads them,
// and two of payments' own.
const (
	// RecoveryCompleted: the provider had charged; the record is COMPLETED.
	RecoveryCompleted = engine.RecoveryCompleted
	// RecoveryReleased: the provider was never called (or answered that it
	// is unavailable); the record is FAILED_RETRYABLE, so the client's next
	// retry executes again with the same payment and provider key.
	RecoveryReleased = engine.RecoveryReleased
	// RecoveryDeclined: the provider remembers a decline for the key.
	RecoveryDeclined = "declined"
	// RecoveryUnknown: the provider could not be asked; the record stays
	// UNKNOWN_REQUIRES_RECOVERY for the next pass.
	RecoveryUnknown = engine.RecoveryUnknown
	// RecoverySkipped: another owner took the record first.
	RecoverySkipped = engine.RecoverySkipped
	// RecoveryConflict: the provider holds another charge under the
	// payment's provider key; the payment is CONFLICT (see
	// PaymentStatusConflict).
	RecoveryConflict = "conflict"
)

var RecoveryOutcomes = []string{RecoveryCompleted, RecoveryReleased, RecoveryDeclined, RecoveryUnknown, RecoverySkipped, RecoveryConflict}

// EngineOperation is create_payment as an operation of the engine: its
// replay window, lock timeout, unknown-outcome code
// (PAYMENT_OUTCOME_UNKNOWN), its replay rendering (the replay rule, see
// ReplayRule) and, with a provider, its Recover, which asks the provider
// before it charges again (see RecoverBatch). Create runs every request
// through the engine with a claim, Execute and Recover bound to the
// request's command (engine.Request); the node's recovery worker runs this
// operation's Recover through the engine (engine.RecoverStale) with every
// other registered operation's.
func (s *Service) EngineOperation() engine.Operation {
	op := engine.Operation{Name: Operation, Window: s.cfg.Window, LockFor: s.cfg.LockFor, UnknownCode: ECodeOutcomeUnknown,
		Replay: s.replayRecord}
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
// client is retrying, through the service's engine (Engine, whose
// RecoverStale also recovers the other operations registered in it):
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
	return s.engine.RecoverStale(ctx, limit)
}

// recoverAttempt is create_payment's engine Recover: it settles a record
// taken over past RECEIVED from the payment the record names and writes
// the outcome itself, in one transaction with the payment's status and
// outbox event. Run by the recovery worker (Attempt.Background), it
// releases a payment the provider never saw rather than charge it.
func (s *Service) recoverAttempt(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	outcome, res, err := s.recoverOwned(ctx, a)
	if err != nil {
		return engine.Result{}, err
	}
	if outcome == RecoverySkipped {
		// A newer owner holds the record.
		return engine.Result{}, fmt.Errorf("payments: recovery: %w", idem.ErrFenced)
	}
	return engine.Result{Stored: true, Status: res.status, Response: res.Response, RecoveryOutcome: outcome}, nil
}

// recoverOwned finishes a record this attempt owns and names the outcome.
func (s *Service) recoverOwned(ctx context.Context, a *engine.Attempt) (string, Result, error) {
	rec := a.Record
	released := Result{status: idem.StatusFailedRetryable}
	if rec.ResourceID == "" {
		// Claimed but no payment was ever written: nothing happened downstream.
		return RecoveryReleased, released, s.release(ctx, a.Lease)
	}
	p, err := s.getPayment(ctx, rec.Tenant, rec.ResourceID)
	if err != nil {
		if errors.Is(err, ErrPaymentNotFound) {
			return RecoveryReleased, released, s.release(ctx, a.Lease)
		}
		return "", Result{}, err
	}
	// Past LOCAL_PAYMENT_CREATED the request reached (or may have reached)
	// the provider: settle asks it, and finishes with the same provider key
	// if it has no charge.
	res, err := s.settle(ctx, a, rec.Checkpoint, p)
	switch {
	case idem.ErrorCode(err) == ECodeProviderUnavailable, err == nil && res.status == idem.StatusFailedRetryable:
		return RecoveryReleased, res, nil
	case idem.ErrorCode(err) == idem.ECodeInProgress:
		return RecoverySkipped, res, nil
	case err != nil:
		return "", res, err
	case res.Unknown:
		return RecoveryUnknown, res, nil
	case res.ProviderKeyConflict:
		return RecoveryConflict, res, nil
	case res.Response.Status == 402:
		return RecoveryDeclined, res, nil
	}
	return RecoveryCompleted, res, nil
}

// release marks an owned record FAILED_RETRYABLE: nothing was charged.
func (s *Service) release(ctx context.Context, lease idem.Lease) error {
	return s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		return store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: ECodeProviderUnavailable})
	})
}

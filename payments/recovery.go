package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fencing"
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

// RecoverBatch reconciles up to limit stale create_payment records that no
// client is retrying: it takes recovery ownership of each (atomically,
// fenced, exactly as a retry would), asks the provider by provider key, and
// records what it learns. A record that had reached PROVIDER_REQUEST_SENT
// and has no charge at the provider is charged again with the same provider
// key (the provider deduplicates it); a record that never reached the
// provider is released for the client's retry. It returns how many records ended in each outcome.
func (s *Service) RecoverBatch(ctx context.Context, limit int) (map[string]int, error) {
	if s.cfg.Provider == nil {
		return nil, nil
	}
	recs, err := store.StaleRecords(ctx, s.store.Pool(), Operation, limit)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, rec := range recs {
		outcome, err := s.recoverOne(ctx, rec)
		if err != nil {
			return out, fmt.Errorf("payments: recover %s/%s: %w", rec.Tenant, rec.Key, err)
		}
		out[outcome]++
	}
	return out, nil
}

func (s *Service) recoverOne(ctx context.Context, rec *idem.Record) (string, error) {
	begin := idem.BeginRequest{
		Scope: rec.Scope, RequestHashes: []string{rec.RequestHash}, HashVersion: rec.HashVersion,
		Owner: s.cfg.Owner + "/recovery", HomeRegion: rec.HomeRegion, LockFor: s.cfg.LockFor, Window: s.cfg.Window,
		ExternalFencing: s.externalFencing(),
	}
	var outcome string
	_, err := s.withLock(ctx, begin, func(b idem.BeginRequest, lock *fencing.Lock) (Result, error) {
		d, err := s.store.Begin(ctx, b)
		if err != nil {
			return Result{}, err
		}
		if d.Outcome != idem.OutcomeRecover {
			outcome = RecoverySkipped
			return Result{}, nil
		}
		if d.Lease.Token == 0 {
			return Result{}, errNeedsLock
		}
		outcome, err = s.recoverOwned(ctx, d, lock)
		return Result{}, err
	})
	switch {
	case idem.ErrorCode(err) == idem.ECodeInProgress:
		return RecoverySkipped, nil
	case err != nil:
		return "", err
	}
	return outcome, nil
}

// recoverOwned finishes a record this worker owns (d.Lease).
func (s *Service) recoverOwned(ctx context.Context, d idem.Decision, lock *fencing.Lock) (string, error) {
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
	res, err := s.drive(ctx, lease, d.Record.Checkpoint, p, lock)
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

package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/store"
)

// Provider is what the payment operation needs of a payment provider;
// *provider.Client satisfies it. Errors must wrap provider's sentinels
// (ErrDeclined, ErrNotFound, ErrUnavailable, ErrStaleToken, ErrAmbiguous) so
// that failures are classified by behaviour.
type Provider interface {
	Charge(ctx context.Context, req provider.ChargeRequest) (provider.Charge, error)
	Lookup(ctx context.Context, providerKey string) (provider.Charge, error)
}

// A payment with a provider goes through these steps (see createCall). No
// transaction is held open across the provider call:
//
//  1. one transaction claims the key and commits the payment row, its
//     PaymentCreated event and checkpoint LOCAL_PAYMENT_CREATED;
//  2. a fenced write moves to PROVIDER_REQUEST_SENT (extending the lock);
//  3. the provider is charged with the provider key derived from the payment
//     id and the owner's fencing token;
//  4. a second transaction records the result: COMPLETED (payment CONFIRMED,
//     PaymentConfirmed event), FAILED_REPLAYABLE (declined),
//     FAILED_RETRYABLE (provider said 5xx: nothing was charged), or
//     UNKNOWN_REQUIRES_RECOVERY (the answer was lost).
//
// A request that takes over a record past PROVIDER_REQUEST_SENT asks the
// provider first (Lookup by provider key) and only charges when the provider
// has no charge for the key, with the same key, so it can never charge twice.

// drive takes an owned payment from checkpoint cp to a recorded result. With
// an external lock (guard set), the owner checks the lock's local deadline
// before the provider call; the provider and the store still reject its
// token if a newer owner took over after that check (a pause between check
// and act).
func (s *Service) drive(ctx context.Context, lease idem.Lease, cp idem.Checkpoint, p Payment, guard func() error) (Result, error) {
	// The provider call and its recording must not be cut short by a client
	// that hangs up: the answer is recorded for its retry. Each step has its
	// own bound (ProviderTimeout for calls, LockFor for store writes), so a
	// pause between steps does not expire the next one: the token does the
	// fencing.
	ctx = context.WithoutCancel(ctx)
	lease = s.unfenced(lease)
	if cp != CheckpointLocalPaymentCreated {
		// An earlier owner may have reached the provider: ask before acting.
		ch, err := s.lookup(ctx, p.ProviderKey)
		switch {
		case err == nil:
			return s.confirm(ctx, lease, p, ch)
		case !errors.Is(err, provider.ErrNotFound):
			return s.markUnknown(ctx, lease, p, err)
		}
	}
	if guard != nil {
		s.failpoint(ctx, "recovery-before-checkpoint")
	}
	if err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		return store.CheckpointTx(ctx, tx, lease, CheckpointProviderRequestSent, s.cfg.LockFor)
	}); err != nil {
		return Result{}, s.fenceAsInProgress(err)
	}
	if guard != nil {
		if err := guard(); err != nil {
			return Result{}, err
		}
	}
	s.failpoint(ctx, "before-provider-call")
	if guard != nil {
		s.failpoint(ctx, "recovery-before-provider-call")
	}
	callCtx, cancelCall := context.WithTimeout(ctx, s.cfg.ProviderTimeout)
	ch, err := s.cfg.Provider.Charge(callCtx, provider.ChargeRequest{
		ProviderKey: p.ProviderKey, AmountMinor: p.AmountMinor, Currency: p.Currency, AccountID: p.AccountID,
		FencingToken: max(lease.Token, 0), Reference: ChargeReference(lease.Scope),
	})
	cancelCall()
	switch {
	case err == nil:
		return s.confirm(ctx, lease, p, ch)
	case errors.Is(err, provider.ErrDeclined):
		return s.decline(ctx, lease, p)
	case errors.Is(err, provider.ErrUnavailable):
		return s.retryable(ctx, lease, err)
	case errors.Is(err, provider.ErrKeyReused):
		// The provider holds this payment's key with another amount: a
		// payment another region made for the same business identity, or
		// a charge another party made under the key.
		return s.providerKeyConflict(ctx, lease, p, err)
	case errors.Is(err, provider.ErrStaleToken):
		// A newer owner reached the provider first: it will finish.
		s.logger.WarnContext(ctx, "provider rejected a stale fencing token", "tenant", lease.Tenant, "key_hash", telemetry.KeyHash(lease.Key), "token", lease.Token)
		s.fenced()
		return Result{}, &idem.Error{Code: idem.ECodeInProgress, Message: "Another owner is completing this request; retry later.", Err: err}
	default:
		return s.markUnknown(ctx, lease, p, err)
	}
}

func (s *Service) lookup(ctx context.Context, key string) (provider.Charge, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ProviderTimeout)
	defer cancel()
	return s.cfg.Provider.Lookup(ctx, key)
}

// confirm records a charge the provider confirmed.
func (s *Service) confirm(ctx context.Context, lease idem.Lease, p Payment, ch provider.Charge) (Result, error) {
	if ch.AmountMinor != p.AmountMinor || ch.Currency != p.Currency {
		return s.providerKeyConflict(ctx, lease, p, fmt.Errorf("provider charge %s is %d %s, payment is %d %s", ch.ChargeID, ch.AmountMinor, ch.Currency, p.AmountMinor, p.Currency))
	}
	if ch.Reference != "" && ch.Reference != ChargeReference(lease.Scope) {
		return s.chargedForAnotherKey(ctx, lease, p, ch)
	}
	var res Result
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		if err := store.CheckpointTx(ctx, tx, lease, CheckpointProviderConfirmed, 0); err != nil {
			return err
		}
		completion, err := s.completion(ctx, tx, p)
		if err != nil {
			return err
		}
		if err := store.CompleteTx(ctx, tx, lease, completion); err != nil {
			return err
		}
		res = Result{Response: completion.Response, status: idem.StatusCompleted}
		return SetPaymentStatus(ctx, tx, p.Tenant, p.ID, "CONFIRMED", paymentEvent(p, "PaymentConfirmed", "confirmed", map[string]string{"chargeId": ch.ChargeID}))
	})
	return res, s.fenceAsInProgress(err)
}

// chargedForAnotherKey records a charge the provider made for another key
// of the same payment (its reference is not this key's): a fresh key for a
// merchant reference another key paid in the region the tenant left, found
// before the handover. The payment is confirmed here as it is there; this
// key gets what the old region would have answered it, a replayable 409
// DUPLICATE_MERCHANT_REFERENCE.
func (s *Service) chargedForAnotherKey(ctx context.Context, lease idem.Lease, p Payment, ch provider.Charge) (Result, error) {
	resp := duplicateResponse(p.ID)
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		if err := store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: ECodeDuplicateMerchantRef, Response: &resp}); err != nil {
			return err
		}
		return SetPaymentStatus(ctx, tx, p.Tenant, p.ID, "CONFIRMED", paymentEvent(p, "PaymentConfirmed", "confirmed", map[string]string{"chargeId": ch.ChargeID}))
	})
	if err != nil {
		return Result{}, s.fenceAsInProgress(err)
	}
	return Result{Response: resp, status: idem.StatusFailedReplayable}, nil
}

// decline records a business rejection: replayed to every retry.
func (s *Service) decline(ctx context.Context, lease idem.Lease, p Payment) (Result, error) {
	resp := problemResponse(ECodePaymentDeclined, "The payment provider declined the payment.", paymentProblem{PaymentID: p.ID})
	resp.SchemaVersion = s.cfg.ResponseSchema
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		if err := store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: ECodePaymentDeclined, Response: &resp}); err != nil {
			return err
		}
		return SetPaymentStatus(ctx, tx, p.Tenant, p.ID, "DECLINED", paymentEvent(p, "PaymentDeclined", "declined", nil))
	})
	return Result{Response: resp, status: idem.StatusFailedReplayable}, s.fenceAsInProgress(err)
}

// PaymentStatusConflict is the terminal status of a payment whose provider
// key already held a charge with another amount or currency: nothing was
// charged for it, and its merchant reference cannot be charged again (the
// payment id, hence the provider key, derives from it). The operator's way
// out is in docs/http-api.md ("Provider key conflicts").
const PaymentStatusConflict = "CONFLICT"

// providerKeyConflict records that the provider already holds a charge with
// another amount or currency under the payment's provider key: nothing is
// charged, the payment ends CONFLICT, and the record stores a replayable
// 409 PROVIDER_KEY_CONFLICT. The payment is never left PENDING without an
// owner.
func (s *Service) providerKeyConflict(ctx context.Context, lease idem.Lease, p Payment, cause error) (Result, error) {
	s.logger.ErrorContext(ctx, "provider holds another charge under this payment's provider key",
		"tenant", lease.Tenant, "key_hash", telemetry.KeyHash(lease.Key), "payment", p.ID, "provider_key", p.ProviderKey, "err", cause)
	resp := providerKeyConflictResponse(p.ID)
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		if err := store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedReplayable, ErrorCode: ECodeProviderKeyConflict, Response: &resp}); err != nil {
			return err
		}
		return SetPaymentStatus(ctx, tx, p.Tenant, p.ID, PaymentStatusConflict, paymentEvent(p, "PaymentProviderKeyConflict", "conflict", nil))
	})
	if err != nil {
		return Result{}, s.fenceAsInProgress(err)
	}
	return Result{Response: resp, ProviderKeyConflict: true, status: idem.StatusFailedReplayable}, nil
}

// providerKeyConflictResponse is the 409 answer of a payment whose provider
// key holds another charge.
func providerKeyConflictResponse(paymentID string) idem.Response {
	resp := problemResponse(ECodeProviderKeyConflict, "The payment provider already holds a different charge for this payment; nothing was charged. Use a new merchant reference, or contact support.",
		paymentProblem{PaymentID: paymentID})
	resp.SchemaVersion = DefaultSchemaVersion
	return resp
}

// retryable records a failure that happened before any side effect: the next
// retry with the key executes again, with the same payment and provider key.
func (s *Service) retryable(ctx context.Context, lease idem.Lease, cause error) (Result, error) {
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		return store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusFailedRetryable, ErrorCode: ECodeProviderUnavailable})
	})
	if err != nil {
		return Result{}, s.fenceAsInProgress(err)
	}
	return Result{status: idem.StatusFailedRetryable}, &idem.Error{Code: ECodeProviderUnavailable, Message: "The payment provider is unavailable; nothing was charged. Retry with the same key.", Err: cause}
}

// markUnknown records that the provider may have charged but the answer was
// lost. Only recovery (a retry or the recovery worker asking the provider)
// moves the record on; the client gets 202 with a stable code.
func (s *Service) markUnknown(ctx context.Context, lease idem.Lease, p Payment, cause error) (Result, error) {
	s.logger.WarnContext(ctx, "payment outcome unknown", "tenant", lease.Tenant, "key_hash", telemetry.KeyHash(lease.Key), "payment", p.ID, "err", cause)
	err := s.ownedTx(ctx, func(tx pgx.Tx) error {
		return store.FailTx(ctx, tx, lease, idem.Failure{Status: idem.StatusUnknown, ErrorCode: ECodeOutcomeUnknown})
	})
	if err != nil {
		return Result{}, s.fenceAsInProgress(err)
	}
	return Result{Response: unknownResponse(p.ID), Unknown: true, status: idem.StatusUnknown}, nil
}

func unknownResponse(paymentID string) idem.Response {
	return problemResponse(ECodeOutcomeUnknown, "The payment was sent to the provider but its outcome is not known yet. Retry with the same key; it will never be charged twice.",
		paymentProblem{PaymentID: paymentID})
}

// ownedTx runs one write of an owner, bounded by the owner's lock duration.
func (s *Service) ownedTx(ctx context.Context, fn func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LockFor)
	defer cancel()
	return s.store.ExecTx(ctx, fn)
}

// fenceAsInProgress turns "another owner took over" into the in-progress
// answer: that owner finishes the operation.
func (s *Service) fenceAsInProgress(err error) error {
	if errors.Is(err, idem.ErrFenced) {
		s.logger.Warn("store rejected a stale fencing token", "err", err)
		s.fenced()
		return &idem.Error{Code: idem.ECodeInProgress, Message: "Another owner is completing this request; retry later.", Err: err}
	}
	return err
}

// paymentEvent builds an outbox event about p. Its id is stable
// ("evt_<paymentId>_<suffix>"), so consumers can deduplicate by it.
func paymentEvent(p Payment, typ, suffix string, extra map[string]string) *Event {
	id := "evt_" + p.ID + "_" + suffix
	fields := map[string]string{"eventId": id, "type": typ, "paymentId": p.ID, "accountId": p.AccountID,
		"amount": FormatMinor(p.AmountMinor, p.Currency), "currency": p.Currency}
	for k, v := range extra {
		fields[k] = v
	}
	payload, _ := json.Marshal(fields)
	return &Event{ID: id, Tenant: p.Tenant, AggregateID: p.ID, Type: typ, Payload: payload}
}

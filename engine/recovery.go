package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Recovery outcomes, counted by RecoverStale.
const (
	// RecoveryCompleted: Recover found the operation done; the record is
	// COMPLETED.
	RecoveryCompleted = "completed"
	// RecoveryFailed: Recover found a deterministic failure; the record is
	// FAILED_REPLAYABLE.
	RecoveryFailed = "failed"
	// RecoveryReleased: nothing happened downstream (the record was at
	// RECEIVED, or Recover said so); the record is FAILED_RETRYABLE and the
	// client's retry executes again.
	RecoveryReleased = "released"
	// RecoveryUnknown: Recover could not tell yet; the record stays
	// UNKNOWN_REQUIRES_RECOVERY for the next pass.
	RecoveryUnknown = "unknown"
	// RecoverySkipped: another owner holds or took the record.
	RecoverySkipped = "skipped"
)

// RecoveryOutcomes are every outcome RecoverStale counts.
var RecoveryOutcomes = []string{RecoveryCompleted, RecoveryFailed, RecoveryReleased, RecoveryUnknown, RecoverySkipped}

// DefaultRecoveryBatch bounds one RecoverStale pass per operation.
const DefaultRecoveryBatch = 50

// RecoverStale runs one recovery pass over every registered operation that
// has a Recover (the others have nothing to ask downstream): up to
// limit (default DefaultRecoveryBatch) records per operation that are
// IN_PROGRESS past their lock or UNKNOWN_REQUIRES_RECOVERY. Each is taken
// over exactly as a client's retry would (under the scope's external lock
// when a Locker is set; exactly one of concurrent recoverers wins it): a
// record still at RECEIVED is released for the client's retry (the engine
// never executes without its client), any other is settled by the
// operation's Recover. It returns how many records ended in each outcome.
func (e *Engine) RecoverStale(ctx context.Context, limit int) (map[string]int, error) {
	if e.opts.Stale == nil {
		return nil, errors.New("engine: recover stale: no StaleLister (set Options.Stale)")
	}
	if limit <= 0 {
		limit = DefaultRecoveryBatch
	}
	out := map[string]int{}
	var errs []error
	for _, name := range e.Operations() {
		op, _ := e.Operation(name)
		if op.Recover == nil {
			// Nothing to ask downstream; a record left at RECEIVED is
			// taken over by the client's retry.
			continue
		}
		recs, err := e.opts.Stale.ListStale(ctx, name, limit)
		if err != nil {
			errs = append(errs, fmt.Errorf("engine: list stale %s: %w", name, err))
			continue
		}
		for _, rec := range recs {
			outcome, err := e.recoverOne(ctx, op, rec)
			if err != nil {
				// The key is a client's: its hash, never the key, reaches
				// the log line this error ends up in.
				errs = append(errs, fmt.Errorf("engine: recover %s key_hash=%s: %w", name, telemetry.KeyHash(rec.Key), err))
				continue
			}
			out[outcome]++
		}
	}
	return out, errors.Join(errs...)
}

// Run calls RecoverStale every interval until ctx is done; failed passes
// are logged. It returns when ctx is done.
func (e *Engine) Run(ctx context.Context, interval time.Duration, limit int) {
	for {
		if err := e.opts.Clock.Sleep(ctx, interval); err != nil {
			return
		}
		if _, err := e.RecoverStale(ctx, limit); err != nil && ctx.Err() == nil {
			e.opts.Logger.WarnContext(ctx, "recovery pass failed", "err", err)
		}
	}
}

func (e *Engine) recoverOne(ctx context.Context, op Operation, rec *idem.Record) (string, error) {
	begin := e.beginRequest(op, rec.Scope, []string{rec.RequestHash}, e.opts.Owner+"/recovery", rec.HomeRegion)
	begin.HashVersion = rec.HashVersion
	c, lock, err := e.claim(ctx, begin, rec.FencingToken, e.begin)
	if idem.ErrorCode(err) == idem.ECodeInProgress {
		return RecoverySkipped, nil
	}
	if err != nil {
		return "", err
	}
	defer unlock(ctx, lock)
	d := c.Decision
	if d.Outcome != idem.OutcomeRecover {
		return RecoverySkipped, nil
	}
	a := &Attempt{Lease: d.Lease, Record: d.Record, Outcome: d.Outcome, Background: true, coord: e.coord, lock: lock}
	if d.Record.Checkpoint == idem.CheckpointReceived {
		if err := e.releaseErr(ctx, a, idem.ECodeUnavailable); err != nil {
			return skippedIfFenced(err)
		}
		return RecoveryReleased, nil
	}
	ans, err := e.run(ctx, Answer{Outcome: d.Outcome}, op, a, op.Recover, false)
	switch {
	case idem.ErrorCode(err) == idem.ECodeInProgress:
		return RecoverySkipped, nil
	case err != nil && !IsRetryable(err) && ans.Status == "":
		return "", err
	}
	if ans.recoveryOutcome != "" {
		return ans.recoveryOutcome, nil
	}
	switch ans.Status {
	case idem.StatusCompleted:
		return RecoveryCompleted, nil
	case idem.StatusFailedReplayable:
		return RecoveryFailed, nil
	case idem.StatusFailedRetryable:
		return RecoveryReleased, nil
	}
	return RecoveryUnknown, nil
}

func skippedIfFenced(err error) (string, error) {
	if errors.Is(err, idem.ErrFenced) {
		return RecoverySkipped, nil
	}
	return "", err
}

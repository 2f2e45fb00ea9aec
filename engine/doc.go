// Package engine drives one scoped, idempotent operation end to end over any
// [idem.Coordinator] (the in-process *store.Store or a remote node's
// coordclient.Client), so that a service supplies only what its operation
// does.
//
// An [Operation] is registered once by name ([Engine.Register]) with its
// Execute function, an optional Recover function, its replay window and its
// lock timeout. [Engine.Do] then runs one request for it:
//
//   - a fresh key is claimed and Execute runs under the claim's lease;
//   - a finished key replays the stored answer ([Answer.Replayed]);
//   - the same key with a different command is refused with
//     IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST;
//   - a key held by another owner answers IDEMPOTENCY_REQUEST_IN_PROGRESS,
//     after waiting up to [Request.Wait] (polled with backoff) for its answer;
//   - a stale, retryable or unknown record is taken over: with a [Locker]
//     (etcd), first under the scope's lock, whose token the record then
//     carries; without one, with the store's own counter. The takeover is a
//     conditional, fenced update that exactly one contender wins;
//   - a key past its window is a new operation.
//
// # What a takeover does
//
// The engine writes checkpoint [CheckpointStarted] before it calls Execute,
// and puts the record back to [idem.CheckpointReceived] before it stores a
// retryable failure. So a record taken over at RECEIVED never had a side
// effect and is executed again; any other checkpoint means a previous owner
// may have acted, and only the operation's Recover (which asks downstream)
// may settle it. Without Recover such a record is left
// UNKNOWN_REQUIRES_RECOVERY and the request answers OUTCOME_UNKNOWN
// (idem.ECodeOutcomeUnknown; payments answers its own
// PAYMENT_OUTCOME_UNKNOWN).
//
// # Failure classes
//
// Execute and Recover report how the attempt ended through [Result.Status]:
// COMPLETED (default) and FAILED_REPLAYABLE are stored and replayed,
// FAILED_RETRYABLE lets the next request with the key execute again, and
// UNKNOWN_REQUIRES_RECOVERY waits for Recover. An error returned by
// Execute is UNKNOWN_REQUIRES_RECOVERY unless it is wrapped by [Retryable];
// an Execute that panics leaves the record FAILED_RETRYABLE and the panic
// goes on. [Engine.RecoverStale] (or [Engine.Run], its loop) runs every
// registered operation's Recover over the records nobody is working on.
//
// An operation whose final write belongs in one transaction with rows of
// its own (a payment's status and its outbox event) writes the record
// itself under [Attempt.Lease] and returns [Result.Stored]; the engine then
// writes nothing. [Operation.UnknownCode] keeps a code its clients already
// know for an unknown outcome (payments: PAYMENT_OUTCOME_UNKNOWN).
//
// Each execution costs one write more than the bare Coordinator calls (the
// STARTED checkpoint); that write is what lets a takeover tell a record
// that never acted from one that may have.
//
// Errors a client may see are *idem.Error with the codes of package idem.
package engine

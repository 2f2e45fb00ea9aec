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
// A record reaches checkpoint [CheckpointStarted] before Execute is called:
// a free key's record is inserted at it by the claim itself
// (idem.BeginRequest.StartAt, so a fresh request writes only its claim and
// its outcome), and a record taken over is moved to it by a fenced write.
// The engine puts the record back to [idem.CheckpointReceived] before it
// stores a retryable failure. A node that dies between its claim and its
// call leaves a record at STARTED: it is recovered (asked downstream), never
// executed again blindly. So a record taken over at RECEIVED never had a side
// effect and is executed again; any other checkpoint means a previous owner
// may have acted, and only the operation's Recover (which asks downstream)
// may settle it. Without Recover such a record is left
// UNKNOWN_REQUIRES_RECOVERY and the request answers OUTCOME_UNKNOWN
// (idem.ECodeOutcomeUnknown, or the operation's own UnknownCode).
//
// # Failure classes
//
// Execute and Recover report how the attempt ended through [Result.Status]:
// COMPLETED (default) and FAILED_REPLAYABLE are stored and replayed,
// FAILED_RETRYABLE lets the next request with the key execute again, and
// UNKNOWN_REQUIRES_RECOVERY waits for Recover. An error returned by
// Execute is UNKNOWN_REQUIRES_RECOVERY unless it is wrapped by [Retryable];
// so is an Execute that panics (the panic may follow a side effect): the
// record is left for Recover at once and the panic goes on. Without a
// Recover, such a record answers OUTCOME_UNKNOWN until an operator settles
// it; it is never executed again silently. [Engine.RecoverStale] (or
// [Engine.Run], its loop) runs every registered operation's Recover over
// the records nobody is working on.
//
// An operation whose final write belongs in one transaction with rows of
// its own (an order's status and its outbox event) writes the record
// itself under [Attempt.Lease] and returns [Result.Stored]; the engine then
// writes nothing (and an error returned with it goes to the caller as it
// is). An error coded IDEMPOTENCY_REQUEST_IN_PROGRESS (what [Attempt.Check]
// returns when the attempt's lock ran out) leaves the record to the owner
// that will finish it. [Operation.UnknownCode] keeps a code its clients
// already know for an unknown outcome.
//
// # Operations that own more of the path
//
// Three optional hooks let an operation over the in-process store keep
// its own rows in the engine's transactions, without a second code path:
//
//   - [Operation.Claim] ([ClaimFunc]) claims the key in place of the
//     Coordinator's Begin, in a transaction of the operation's own
//     (store.ClaimTx or an insert-first statement of its own) together
//     with its rows. It may finish the operation there ([Claim.Done]: one
//     transaction for record, rows and events), or write a checkpoint of
//     its own ([Claim.Progress]), after which Execute runs without the
//     STARTED write. It answers a takeover that needs the scope's lock
//     as Begin does, and the engine locks and claims again with the token.
//   - [Operation.Replay] renders a replayed answer from the stored record
//     (a response stored under an older schema, rebuilt in the current one).
//   - [Attempt] tells Execute and Recover how the record was claimed
//     ([Attempt.Outcome], [Attempt.Takeover], Record.Checkpoint, the
//     fencing token in Lease) and whether a client waits for it
//     ([Attempt.Background] is set by RecoverStale), so a takeover can
//     depend on the checkpoint and on who took over: an operation may run
//     a side effect left before its downstream call for a client's retry,
//     but only release it for the recovery worker.
//
// [Request.Execute], [Request.Recover] and [Request.Claim] bind those
// functions to one request (its parsed command, say).
//
// Each execution through the Coordinator's Begin costs one write more than
// the bare Coordinator calls (the STARTED checkpoint); that write is what
// lets a takeover tell a record that never acted from one that may have. A
// Claim that writes its own progress saves it.
//
// # Answers from memory
//
// With [Options.AnswerCache], the engine keeps the answers of settled
// records (COMPLETED, FAILED_REPLAYABLE) in memory, bounded by bytes
// (package [github.com/idemcoord/idem/engine/answers]), and Do replays a
// retry, or refuses a reused key, with no store round trip. An answer is
// kept only from a commit the node saw acknowledged ([AcknowledgedWriter],
// or an operation's own transaction) or from a durable read (a replay the
// Coordinator or a ClaimFunc decided), for no longer than its record's
// window and the retention, measured on the engine's Clock from the store's
// time ([StoreClock]); see [AnswerCache]. [Engine.Begin] does the same for a
// caller that serves the Coordinator contract (the coordination API).
//
// A request that brings its raw hash ([Request.RawHash]) and parses its
// command only when asked ([Request.Fingerprint]) is replayed from memory
// without being parsed when its raw hash is the one the answer was kept
// with: the same bytes, operation, path parameters and semantic headers are
// the same command. Any other request is parsed, and its request hashes
// decide as the store's would (a different serialisation of the same
// command replays, another command is refused).
//
// Errors a client may see are *idem.Error with the codes of package idem.
package engine

package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem/internal/telemetry"
)

// ExecTx runs fn in a SERIALIZABLE transaction through crdbpgx.ExecuteTx and
// retries it on serialization failures (SQLSTATE 40001) and deadlocks (40P01).
//
// crdbpgx retries inside the transaction by rolling back to a savepoint. That
// is what CockroachDB wants, but on PostgreSQL the transaction keeps its
// snapshot across a savepoint rollback, so the retry sees the same conflict;
// and crdb ignores the COMMIT error because on CockroachDB RELEASE has already
// committed, while on PostgreSQL COMMIT is where SSI may still abort. ExecTx
// therefore keeps the commit error and starts a fresh transaction (with a
// jittered, growing pause) whenever the failure is retryable, up to
// Options.TxAttempts. On PostgreSQL, where the savepoint buys nothing, a
// transaction is BEGIN, fn's statements and COMMIT: two round trips fewer.
//
// fn may run several times and must have no effect outside the database.
// Errors from fn are returned unchanged when not retryable; connection
// failures, and serialization failures or deadlocks that outlast
// Options.TxAttempts, are returned as *idem.Error with code
// STORE_UNAVAILABLE (wrapping the last error). A transaction whose commit
// went unanswered or was answered 40003 (on CockroachDB the commit is
// crdb's RELEASE SAVEPOINT cockroach_restart) is not run again: its error
// wraps ErrCommitUnknown. A 40001 at RELEASE is a definite abort: crdb
// runs fn again from the savepoint once, then ExecTx starts a fresh
// transaction, so on CockroachDB fn runs up to twice per attempt.
func (s *Store) ExecTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.execTx(ctx, pgx.Serializable, fn)
}

// ExecTxReadCommitted is ExecTx at READ COMMITTED on PostgreSQL, for work
// whose correctness rests on row locks and unique constraints alone, not on
// what its reads saw: a queue taken with SELECT ... FOR UPDATE SKIP LOCKED
// (which re-checks each row it locks against its WHERE clause), and writes
// that are INSERT ... ON CONFLICT. Such work at SERIALIZABLE pays for
// predicate locks it does not need, and PostgreSQL keeps a committed
// serializable transaction's predicate locks for as long as any transaction
// that overlapped it runs, in one table shared by every database of the
// server (max_pred_locks_per_transaction × max_connections slots): a
// stream of queue batches beside the request traffic fills it, and then
// every serializable statement of the server fails with "out of shared
// memory". On CockroachDB, which has no such table, it runs as ExecTx.
func (s *Store) ExecTxReadCommitted(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.execTx(ctx, pgx.ReadCommitted, fn)
}

func (s *Store) execTx(ctx context.Context, iso pgx.TxIsoLevel, fn func(pgx.Tx) error) (err error) {
	ctx, span := telemetry.Start(ctx, "store.tx", trace.SpanKindInternal)
	defer func() { endSpan(span, err) }()
	return s.retry(ctx, func() error {
		c := &commitKeeper{pool: s.pool}
		var err error
		if s.cockroach(ctx) {
			err = crdbpgx.ExecuteTx(crdb.WithMaxRetries(ctx, 1), c, pgx.TxOptions{IsoLevel: pgx.Serializable}, fn)
		} else {
			err = c.run(ctx, iso, fn)
		}
		if err == nil {
			err = c.commitErr
		}
		if err != nil {
			if cause := c.unknown(err); cause != nil {
				return asUnavailable(fmt.Errorf("%w: %w", ErrCommitUnknown, cause))
			}
		}
		return err
	})
}

// ErrCommitUnknown marks an error of ExecTx or ExecOne whose transaction
// may or may not have committed: the connection failed after its commit
// (COMMIT, or RELEASE SAVEPOINT cockroach_restart on CockroachDB) was sent
// and before its answer came back, or the server answered that the result
// is ambiguous (SQLSTATE 40003, which CockroachDB sends when it cannot tell
// whether a commit took effect). The error is also STORE_UNAVAILABLE (an
// *idem.Error); callers that can tell what the transaction did by reading
// it back (Begin by its claim id, Checkpoint, Complete and Fail by the
// record under their lease) do so instead of answering a failure for a
// write that happened, and nothing runs such a transaction again as if it
// had not.
var ErrCommitUnknown = errors.New("store: the transaction's commit outcome is unknown")

// ambiguous reports whether a commit (COMMIT, or crdb's RELEASE SAVEPOINT
// cockroach_restart) that failed with err may have committed: the server
// did not answer it, or answered 40003 ("result is ambiguous"). Any other
// server error is an answer, and a definite abort. pgconn.SafeToRetry
// cannot tell here: a connection that drops while the commit's answer is
// awaited is reported as "conn closed", which it calls safe to retry
// although the commit went out.
func ambiguous(err error) bool {
	if code := sqlState(err); code != "" {
		return code == codeAmbiguousResult
	}
	// ErrTxCommitRollback is the server's answer too: it rolled back.
	return !errors.Is(err, pgx.ErrTxCommitRollback)
}

// run is one PostgreSQL transaction: BEGIN, fn, COMMIT (whose error is
// kept), or ROLLBACK when fn fails.
func (c *commitKeeper) run(ctx context.Context, iso pgx.TxIsoLevel, fn func(pgx.Tx) error) error {
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

// commitKeeper begins transactions whose commit's error is remembered:
// COMMIT's, and under crdbpgx.ExecuteTx that of RELEASE SAVEPOINT
// cockroach_restart, which is CockroachDB's commit (crdb then sends COMMIT
// and ignores its error).
type commitKeeper struct {
	pool      *pgxpool.Pool
	commitErr error
	// releaseErr is the last RELEASE SAVEPOINT cockroach_restart's error:
	// crdb retries from the savepoint after a 40001 there and sends
	// RELEASE again, so only the last one says how the transaction ended.
	releaseErr error
}

// unknown returns what makes a transaction that failed with err of unknown
// outcome, nil when it certainly did not commit: a commit or a RELEASE
// that was not answered or was answered 40003, or a 40003 from any of its
// statements (CockroachDB's "result is ambiguous", which says a write may
// have taken effect).
func (c *commitKeeper) unknown(err error) error {
	switch {
	case c.commitErr != nil && ambiguous(c.commitErr):
		return c.commitErr
	case c.releaseErr != nil && ambiguous(c.releaseErr):
		return c.releaseErr
	case sqlState(err) == codeAmbiguousResult:
		return err
	}
	return nil
}

func (c *commitKeeper) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

func (c *commitKeeper) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	tx, err := c.pool.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return &keptTx{Tx: tx, keeper: c}, nil
}

type keptTx struct {
	pgx.Tx
	keeper *commitKeeper
}

func (t *keptTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.keeper.commitErr = err
	return err
}

// releaseSavepoint is crdb's commit (crdb.ExecuteInTx sends exactly this).
const releaseSavepoint = "RELEASE SAVEPOINT cockroach_restart"

// Exec keeps the error of RELEASE SAVEPOINT cockroach_restart, which crdb
// sends through the transaction it was given (this one).
func (t *keptTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	if sql == releaseSavepoint {
		t.keeper.releaseErr = err
	}
	return tag, err
}

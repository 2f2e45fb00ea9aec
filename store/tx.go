package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
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
// STORE_UNAVAILABLE (wrapping the last error).
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
		if err != nil && c.commitErr != nil && ambiguous(c.commitErr) {
			return unavailable(fmt.Errorf("%w: %w", ErrCommitUnknown, c.commitErr))
		}
		return err
	})
}

// ErrCommitUnknown marks an error of ExecTx whose transaction may or may not
// have committed: the connection failed after COMMIT was sent and before
// its answer came back. The error is also STORE_UNAVAILABLE (an *idem.Error);
// callers that can tell what the transaction did by reading it back (Begin by
// its claim id, Checkpoint, Complete and Fail by the record under their
// lease) do so instead of answering a failure for a write that happened.
var ErrCommitUnknown = errors.New("store: the transaction's commit outcome is unknown")

// ambiguous reports whether a COMMIT that failed with err may have committed:
// the server did not answer it (a PostgreSQL error is an answer, and a
// definite abort). pgconn.SafeToRetry cannot tell here: a connection that
// drops while the COMMIT's answer is awaited is reported as "conn closed",
// which it calls safe to retry although the COMMIT went out.
func ambiguous(err error) bool {
	// ErrTxCommitRollback is the server's answer too: it rolled back.
	return sqlState(err) == "" && !errors.Is(err, pgx.ErrTxCommitRollback)
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

// commitKeeper begins transactions whose Commit error is remembered.
type commitKeeper struct {
	pool      *pgxpool.Pool
	commitErr error
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

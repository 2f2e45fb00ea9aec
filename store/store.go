// Package store keeps idempotency records on PostgreSQL or CockroachDB
// through pgx, and gives an operation with tables of its own what it needs
// to write them with its records (ClaimWith, ReferenceRead, Querier and
// the transaction helpers, HandoverRows).
//
// Every transaction runs at SERIALIZABLE: a multi-statement one through
// cockroach-go's crdbpgx.ExecuteTx on CockroachDB and as BEGIN, its
// statements and COMMIT on PostgreSQL (see [Store.ExecTx]), a write that is one
// statement as an implicit transaction of its own (one round trip instead of
// five), which the pool's sessions run at SERIALIZABLE whatever the server's
// default. Every timestamp is taken from the
// store's clock (now() in SQL), never from a node's clock. The SQL is kept to
// the subset that both PostgreSQL and CockroachDB accept; CockroachDB-only DDL
// (REGIONAL BY ROW, row-level TTL) lives in deploy/cockroach.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Options configure Open.
type Options struct {
	// MaxConns is the pool size. Default: pgxpool's default (max(4, NumCPU)),
	// raised to 16.
	MaxConns int32
	// Logger receives store diagnostics. Default: discard.
	Logger *slog.Logger
	// TxAttempts bounds how many times ExecTx starts a transaction anew after
	// a serialization failure. Default 30.
	TxAttempts int
	// NoReplayRead turns off the replay fast path (see [Store.ReadSettled]):
	// every request then goes straight to the insert-first claim. Benchmarks
	// use it to measure the fast path against its absence.
	NoReplayRead bool
	// NoGroupCommit sends every claim and completion in a statement of its
	// own instead of batching those of concurrent requests (see
	// [Store.Begin], [Store.Complete]). Benchmarks use it to measure group
	// commit.
	NoGroupCommit bool
}

// Store is a connection pool to the idempotency store. It is safe for
// concurrent use. Close it when done.
type Store struct {
	pool       *pgxpool.Pool
	logger     *slog.Logger
	txAttempts int
	replayRead bool
	// claims, checkpoints and completions batch the claims, checkpoints
	// and completions of concurrent requests (nil: NoGroupCommit).
	claims      *group[claimIn, claimOut]
	checkpoints *group[checkpointIn, struct{}]
	completions *group[completionIn, struct{}]
	// server is what the pool's connections talk to, learnt from the
	// first connection: 0 not yet known, serverPostgres or
	// serverCockroach.
	server atomic.Int32
}

const (
	serverPostgres int32 = iota + 1
	serverCockroach
)

// Open connects to the database at url. It does not apply migrations; call
// Migrate.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: parse database url: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 16)
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	cfg.ConnConfig.Tracer = queryTracer{}
	cfg.ConnConfig.DialFunc = dial
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := checkStandbys(ctx, conn)
		return err
	}
	// Single-statement writes run as implicit transactions (ExecOne): at
	// SERIALIZABLE like every other, whatever the server's default.
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s := &Store{pool: pool, logger: opts.Logger, txAttempts: opts.TxAttempts, replayRead: !opts.NoReplayRead}
	if !opts.NoGroupCommit {
		s.claims, s.checkpoints, s.completions = s.newClaims(), s.newCheckpoints(), s.newCompletions()
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.txAttempts <= 0 {
		s.txAttempts = 30
	}
	return s, nil
}

// Close closes every connection of the pool.
func (s *Store) Close() { s.pool.Close() }

// ReplayRead reports whether the replay fast path is on (not
// Options.NoReplayRead): whether ReadSettled and the claims read a settled
// record instead of deciding only in a transaction.
func (s *Store) ReplayRead() bool { return s.replayRead }

// Pool returns the underlying pool, for callers that own tables of their own.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the store answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return unavailable(fmt.Errorf("store: ping: %w", err))
	}
	return nil
}

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

// retry runs once until it succeeds, fails with ErrCommitUnknown or an
// error that is not retryable, or has run Options.TxAttempts times, with a
// jittered, growing pause between runs; the last error is classified by
// txFailure.
func (s *Store) retry(ctx context.Context, once func() error) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = once()
		if err == nil || errors.Is(err, ErrCommitUnknown) {
			return err
		}
		if !retryable(err) || attempt >= s.txAttempts {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: transaction: %w", ctx.Err())
		case <-time.After(retryPause(attempt)):
		}
	}
	return s.txFailure(err)
}

// Read runs fn, which only reads, on a pooled connection, retrying it as
// transactions are retried: at SERIALIZABLE a read can fail with a
// serialization failure too (SQLSTATE 40001) while others write. Errors are
// classified as ExecTx's are.
func (s *Store) Read(ctx context.Context, fn func(Querier) error) error {
	return s.retry(ctx, func() error { return fn(s.pool) })
}

// ExecOne runs fn, which must send exactly one statement through q, as an
// implicit transaction: one round trip, where ExecTx takes three on
// PostgreSQL (BEGIN, the statement, COMMIT) and five on CockroachDB
// (crdbpgx's SAVEPOINT and RELEASE besides). Sessions run at SERIALIZABLE
// (see Open), serialization failures and deadlocks are retried as ExecTx
// retries them, and errors are classified alike. A statement whose answer
// is lost after it was sent may have committed, as a lost COMMIT may: that
// error wraps ErrCommitUnknown.
func (s *Store) ExecOne(ctx context.Context, fn func(Querier) error) (err error) {
	ctx, span := telemetry.Start(ctx, "store.exec", trace.SpanKindInternal)
	defer func() { endSpan(span, err) }()
	return s.retry(ctx, func() error { return s.execOnce(ctx, fn) })
}

// execOnce runs fn once on a connection of its own. A failure to get the
// connection sent nothing; a connection failure after it may have come
// after the server committed (pgconn may even call a connection dropped
// while the answer was awaited safe to retry), so it is ErrCommitUnknown.
func (s *Store) execOnce(ctx context.Context, fn func(Querier) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = fn(conn)
	if err != nil && sqlState(err) == "" && (isUnavailable(err) || errors.Is(err, context.Canceled)) {
		return unavailable(fmt.Errorf("%w: %w", ErrCommitUnknown, err))
	}
	return err
}

// txFailure classifies the last error of a transaction that was given up.
func (s *Store) txFailure(err error) error {
	if isUnavailable(err) {
		return unavailable(err)
	}
	if code := sqlState(err); code == codeSerializationFailure || code == codeDeadlock {
		// Every attempt lost a conflict and was rolled back: nothing was
		// written, so the caller may retry the same request; that is a
		// 503, not an internal error. A burst of retries on a store that
		// has just failed over (every node's recovery worker and the
		// clients' retries on the same keys) can get here.
		return &idem.Error{Code: idem.ECodeStoreUnavailable, Message: "The idempotency store is contended; retry with the same key.",
			Err: fmt.Errorf("store: transaction lost %d conflicts in a row: %w", s.txAttempts, err)}
	}
	return err
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

// cockroach reports whether the store is CockroachDB, which announces
// itself with the crdb_version parameter at connection start. It is learnt
// once; until a connection can be had it says no (the transaction that
// follows fails to connect anyway).
func (s *Store) cockroach(ctx context.Context) bool {
	switch s.server.Load() {
	case serverPostgres:
		return false
	case serverCockroach:
		return true
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false
	}
	defer conn.Release()
	server := serverPostgres
	if conn.Conn().PgConn().ParameterStatus("crdb_version") != "" {
		server = serverCockroach
	}
	s.server.Store(server)
	return server == serverCockroach
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

// SQLSTATE codes the store acts on.
const (
	codeSerializationFailure = "40001"
	codeDeadlock             = "40P01"
	codeUniqueViolation      = "23505"
)

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// retryPause is the wait before attempt+1: full jitter over an exponential
// ceiling (1 ms, 2 ms, 4 ms, ... capped at 100 ms). Transactions that keep
// colliding (publishers scanning a range that writers insert into) spread out
// instead of colliding again on the same short beat, and 30 attempts span
// seconds rather than a few hundred milliseconds.
func retryPause(attempt int) time.Duration {
	ceiling := min(time.Millisecond<<min(attempt-1, 7), 100*time.Millisecond)
	return time.Duration(rand.Int64N(int64(ceiling)) + 1)
}

// retryable reports whether the whole transaction may be run again: a
// serialization failure or deadlock, or a failure that pgconn reports as
// having happened before anything was sent (a connection already closed).
func retryable(err error) bool {
	switch sqlState(err) {
	case codeSerializationFailure, codeDeadlock:
		return true
	}
	return pgconn.SafeToRetry(err)
}

// isUnavailable reports whether err means the store could not be reached or
// dropped the connection, as opposed to rejecting a statement.
func isUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	code := sqlState(err)
	// Class 08: the connection; 57P01, 57P03: the server shutting down or
	// starting; class 53, insufficient resources (out of memory or shared
	// memory, disk full, too many connections): the store cannot serve
	// now, which says nothing about the request.
	return len(code) == 5 && (code[:2] == "08" || code[:2] == "53" || code == "57P01" || code == "57P03")
}

// Unavailable classifies err as the store's callers see it: a failure to
// reach the store becomes *idem.Error STORE_UNAVAILABLE; anything else is
// returned unchanged.
func Unavailable(err error) error { return unavailableOr(err) }

func unavailable(err error) error {
	var e *idem.Error
	if errors.As(err, &e) {
		return err
	}
	return &idem.Error{Code: idem.ECodeStoreUnavailable, Message: "The idempotency store is unavailable; retry with the same key.", Err: err}
}

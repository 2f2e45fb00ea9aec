// Package store keeps idempotency records on PostgreSQL or CockroachDB
// through pgx, and gives an operation with tables of its own what it needs
// to write them with its records (ClaimWith, ReferenceRead, Querier and
// the transaction helpers, HandoverRows).
//
// Every transaction runs at SERIALIZABLE: a multi-statement one through
// cockroach-go's crdbpgx.ExecuteTx on CockroachDB and as BEGIN, its
// statements and COMMIT on PostgreSQL (see [Store.ExecTx]), a write that is
// one statement as BEGIN, the statement and COMMIT sent together (one round
// trip instead of three; see [Store.ExecOne]). The isolation is named in
// each BEGIN, never set for a session, and the store keeps no session
// state: it runs unchanged behind a transaction pooler (PgBouncer in
// transaction mode) given a URL whose default_query_exec_mode needs no
// named prepared statements (exec). Every timestamp is taken from the
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
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/share"
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
	// Server says what the URL leads to. Default (ServerDetect): asked of
	// the server itself (SELECT version()) on the pool's first connection,
	// which works behind a pooler that relays no parameter status.
	Server Server
}

// Server is the kind of SQL server a Store talks to.
type Server int32

const (
	// ServerDetect asks the server (the default).
	ServerDetect Server = iota
	// ServerPostgres is PostgreSQL: a multi-statement transaction is
	// BEGIN, its statements and COMMIT.
	ServerPostgres
	// ServerCockroach is CockroachDB: a multi-statement transaction runs
	// through crdbpgx.ExecuteTx (SAVEPOINT cockroach_restart, RELEASE,
	// COMMIT), and a result it calls ambiguous (SQLSTATE 40003) is an
	// unknown commit outcome.
	ServerCockroach
)

// String names s as the --database-server flag spells it.
func (s Server) String() string {
	switch s {
	case ServerPostgres:
		return "postgres"
	case ServerCockroach:
		return "cockroach"
	}
	return "detect"
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
	// groups count what each kind of group commit sent (GroupStats), in
	// groupKinds' order.
	groups [len(groupKinds)]groupCounters
	// taken is the share of recent claims (Begin's) that found their key
	// taken; claimOrRead chooses its statement by it.
	taken share.Share
	// server is what the pool's connections talk to: Options.Server, or
	// learnt from the first connection (ServerDetect until then).
	server atomic.Int32
}

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
	// No session state and no startup parameter of the store's own: a
	// transaction pooler (PgBouncer in transaction mode) hands each
	// transaction to whichever server connection is free, and refuses
	// startup parameters it does not track. Every statement carries its
	// isolation in the statement stream instead (see serialConn).
	s := &Store{logger: opts.Logger, txAttempts: opts.TxAttempts, replayRead: !opts.NoReplayRead}
	s.server.Store(int32(opts.Server))
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := s.detect(ctx, conn); err != nil {
			return err
		}
		_, err := checkStandbys(ctx, conn, s.Server() == ServerCockroach)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s.pool = pool
	if !opts.NoGroupCommit {
		s.claims, s.checkpoints, s.completions = s.newClaims(), s.newCheckpoints(), s.newCompletions()
		s.claims.stats, s.checkpoints.stats = s.groupCounters(GroupClaims), s.groupCounters(GroupCheckpoints)
		s.completions.stats = s.groupCounters(GroupCompletions)
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

// TakenShare is the share of the store's recent claims (Begin's, about
// the last 64) that found their key taken: above a tenth a claim alone
// reads the record that took it in its own statement.
func (s *Store) TakenShare() float64 { return s.taken.Value() }

// ReplayRead reports whether the replay fast path is on (not
// Options.NoReplayRead): whether ReadSettled and the claims read a settled
// record instead of deciding only in a transaction.
func (s *Store) ReplayRead() bool { return s.replayRead }

// Pool returns the underlying pool, for callers that own tables of their own.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the store answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return asUnavailable(fmt.Errorf("store: ping: %w", err))
	}
	return nil
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

// Read runs fn, which only reads; each statement it sends is a
// SERIALIZABLE transaction of its own (as ExecOne's), and fn is retried as
// transactions are retried: at SERIALIZABLE a read can fail with a
// serialization failure too (SQLSTATE 40001) while others write. Errors are
// classified as ExecTx's are.
func (s *Store) Read(ctx context.Context, fn func(Querier) error) error {
	return s.retry(ctx, func() error { return fn(serialPool{s.pool}) })
}

// ExecOne runs fn, which must send exactly one statement through q, as a
// SERIALIZABLE transaction of its own in one round trip: BEGIN, the
// statement and COMMIT go out together (see serialConn), where ExecTx waits
// for each (three round trips on PostgreSQL, five on CockroachDB with
// crdbpgx's SAVEPOINT and RELEASE). Serialization failures and deadlocks
// are retried as ExecTx retries them, and errors are classified alike. A
// statement whose answer is lost after it was sent may have committed, as a
// lost COMMIT may: that error wraps ErrCommitUnknown.
func (s *Store) ExecOne(ctx context.Context, fn func(Querier) error) error {
	return s.execOne(ctx, false, fn)
}

// execBatch is ExecOne for a batch statement of the group commit: on
// PostgreSQL the statement uses its generic plan (batchPlan).
// CockroachDB, where the session variables are not set, plans as it
// chooses.
func (s *Store) execBatch(ctx context.Context, fn func(Querier) error) error {
	return s.execOne(ctx, true, fn)
}

func (s *Store) execOne(ctx context.Context, batch bool, fn func(Querier) error) (err error) {
	ctx, span := telemetry.Start(ctx, "store.exec", trace.SpanKindInternal)
	defer func() { endSpan(span, err) }()
	return s.retry(ctx, func() error { return s.execOnce(ctx, batch, fn) })
}

// execOnce runs fn once on a connection of its own. A failure to get the
// connection sent nothing; a connection failure after it may have come
// after the server committed (pgconn may even call a connection dropped
// while the answer was awaited safe to retry), and so may a statement or
// COMMIT the server answers 40003 ("result is ambiguous": CockroachDB's
// answer, implicit transactions included, when it cannot tell whether a
// write took effect): either is ErrCommitUnknown, never retried as if
// nothing had happened.
func (s *Store) execOnce(ctx context.Context, batch bool, fn func(Querier) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// A connection has told what the server is by now.
	err = fn(serialConn{conn: conn.Conn(), generic: batch && s.Server() != ServerCockroach})
	if err == nil {
		return nil
	}
	code := sqlState(err)
	if code == codeAmbiguousResult || code == "" && (isUnavailable(err) || errors.Is(err, context.Canceled)) {
		return asUnavailable(fmt.Errorf("%w: %w", ErrCommitUnknown, err))
	}
	return err
}

// txFailure classifies the last error of a transaction that was given up.
func (s *Store) txFailure(err error) error {
	if isUnavailable(err) {
		return asUnavailable(err)
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

// cockroach reports whether the store is CockroachDB. Until a connection
// can be had it says no (the transaction that follows fails to connect
// anyway).
func (s *Store) cockroach(ctx context.Context) bool {
	if Server(s.server.Load()) == ServerDetect {
		if conn, err := s.pool.Acquire(ctx); err == nil {
			conn.Release() // AfterConnect detected it
		}
	}
	return s.Server() == ServerCockroach
}

// Server reports what the store talks to: Options.Server, or what the
// first connection learnt (ServerDetect before one was made).
func (s *Store) Server() Server { return Server(s.server.Load()) }

// detect checks a new connection and asks the server what it is.
//
// Every connection opens a transaction and rolls it back: a pooler that
// refuses transactions (PgBouncer in statement pooling) is refused here,
// with the reason, so a node stops at start instead of failing every
// request. Inside that transaction it asks the server's version():
// CockroachDB says so there (learnt once per Store, unless Options.Server
// names it). It asks rather than reading the crdb_version parameter
// status, which a pooler in between need not relay. Nothing it sends
// commits.
func (s *Store) detect(ctx context.Context, conn *pgx.Conn) error {
	// BEGIN waits for its own answer: a statement pooler lets a
	// transaction through that ends before the server says it is idle,
	// and refuses one left open.
	_, err := conn.Exec(ctx, beginSerializable)
	var version string
	if err == nil {
		b := &pgx.Batch{}
		b.Queue(`SELECT version()`).QueryRow(func(row pgx.Row) error { return row.Scan(&version) })
		b.Queue(`ROLLBACK`)
		err = conn.SendBatch(ctx, b).Close()
	}
	if err != nil {
		if statementPooling(err) {
			return fmt.Errorf("store: the database URL leads to a pooler in statement pooling mode, "+
				"which runs no transaction the store needs; use transaction pooling (PgBouncer: pool_mode = transaction): %w", err)
		}
		return fmt.Errorf("store: check the server: %w", err)
	}
	server := ServerPostgres
	if strings.Contains(version, "CockroachDB") {
		server = ServerCockroach
	}
	s.server.CompareAndSwap(int32(ServerDetect), int32(server))
	return nil
}

// statementPooling reports whether err is PgBouncer's refusal of a
// transaction in statement pooling mode.
func statementPooling(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "statement pooling")
}

// SQLSTATE codes the store acts on.
const (
	codeSerializationFailure = "40001"
	codeDeadlock             = "40P01"
	codeUniqueViolation      = "23505"
	// codeAmbiguousResult is CockroachDB's "result is ambiguous" (PostgreSQL
	// names the code statement_completion_unknown and never sends it): the
	// statement or commit may or may not have taken effect.
	codeAmbiguousResult = "40003"
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
// An ambiguous result (40003) never is: what it answered may have
// committed (ExecTx and ExecOne report it as ErrCommitUnknown first).
func retryable(err error) bool {
	switch sqlState(err) {
	case codeSerializationFailure, codeDeadlock:
		return true
	case codeAmbiguousResult:
		return false
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
	// now, which says nothing about the request. 40003, an ambiguous
	// result: the store could not tell what it did (a read answered so is
	// retried by the client; a write is ErrCommitUnknown before this).
	return len(code) == 5 && (code[:2] == "08" || code[:2] == "53" || code == "57P01" || code == "57P03" || code == codeAmbiguousResult)
}

// Classify classifies err as the store's callers see it: a failure to
// reach the store (a refused or dropped connection, a timeout, a server
// shutting down or out of resources) becomes *idem.Error
// STORE_UNAVAILABLE; anything else is returned unchanged.
func Classify(err error) error {
	if isUnavailable(err) {
		return asUnavailable(err)
	}
	return err
}

// asUnavailable wraps err, whatever it is, as *idem.Error
// STORE_UNAVAILABLE (err itself if it is an *idem.Error already): for a
// failure the caller has already classified as the store's.
func asUnavailable(err error) error {
	var e *idem.Error
	if errors.As(err, &e) {
		return err
	}
	return &idem.Error{Code: idem.ECodeStoreUnavailable, Message: "The idempotency store is unavailable; retry with the same key.", Err: err}
}

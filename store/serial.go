package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// beginSerializable opens each of the store's transactions: the isolation
// travels in the statement stream, never as a session default or a
// startup parameter, so that it holds behind a transaction pooler, which
// gives each transaction whatever server connection is free.
const beginSerializable = `BEGIN ISOLATION LEVEL SERIALIZABLE`

// serialConn is a Querier on one connection that runs each statement as a
// SERIALIZABLE transaction of its own: BEGIN, the statement and COMMIT go
// out together and are answered together, one round trip as an implicit
// transaction would be. A statement that fails leaves the transaction
// aborted, and it is rolled back before the connection is used again.
//
// A COMMIT whose answer is lost may have committed: the connection error
// comes back from the call, as it would for an implicit transaction, and
// ExecOne calls it ErrCommitUnknown.
type serialConn struct {
	conn *pgx.Conn
	// generic, when set, makes the statement use its generic plan
	// (batchPlan).
	generic bool
}

// batchPlan makes the statement after it in a transaction use its generic
// plan, made without sequential scans. A batch statement reads its rows
// from arrays whose length only the bound values tell: PostgreSQL's plan
// cache planned nearly every batch afresh (its custom plans, costed on the
// batch's true size, looked cheaper than the generic one, costed on a
// guess of ten rows), about 150 µs of planning per batch of six or seven
// writes, for the same plan each time: one primary-key probe per row. A
// generic plan is kept for the connection's life (until the tables'
// statistics change), so it is made without sequential scans: one made
// while the records table is empty would otherwise scan it, and go on
// scanning it as it grows. SET LOCAL (set_config's third argument) ends
// with the transaction, so it holds behind a transaction pooler too.
const batchPlan = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// Conn returns the connection, for durable.
func (c serialConn) Conn() *pgx.Conn { return c.conn }

// send queues sql between BEGIN and COMMIT and reads BEGIN's answer.
func (c serialConn) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(beginSerializable)
	if c.generic {
		b.Queue(batchPlan)
	}
	b.Queue(sql, args...)
	b.Queue(`COMMIT`)
	br := c.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		return nil, c.finish(ctx, br, err)
	}
	if c.generic {
		if _, err := br.Exec(); err != nil {
			return nil, c.finish(ctx, br, err)
		}
	}
	return br, nil
}

// finish reads COMMIT's answer (unless err already failed the batch),
// closes the batch, and rolls back a transaction a failure left open. It
// returns the first error.
func (c serialConn) finish(ctx context.Context, br pgx.BatchResults, err error) error {
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !c.conn.IsClosed() && c.conn.PgConn().TxStatus() != 'I' {
		// The statement failed (a serialization failure, a constraint):
		// the server skipped COMMIT and holds the aborted transaction.
		// A connection that cannot roll back is closed, so that the pool
		// drops it.
		if _, rerr := c.conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`); rerr != nil {
			_ = c.conn.Close(context.WithoutCancel(ctx))
		}
	}
	return err
}

func (c serialConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := c.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, c.finish(ctx, br, err)
}

func (c serialConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := c.send(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return &serialRow{c: c, ctx: ctx, br: br}
}

func (c serialConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := c.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, c.finish(ctx, br, err)
	}
	return &serialRows{Rows: rows, c: c, ctx: ctx, br: br}, nil
}

// serialRow is QueryRow's answer: Scan reads the row, then COMMIT's answer.
type serialRow struct {
	c   serialConn
	ctx context.Context
	br  pgx.BatchResults
}

func (r *serialRow) Scan(dest ...any) error {
	err := r.br.QueryRow().Scan(dest...)
	// No row is the statement's answer, not a failure: the transaction
	// commits all the same. A scan error is the client's: the statement
	// ran, and commits as an implicit transaction would.
	ferr := r.c.finish(r.ctx, r.br, serverErr(err))
	if ferr != nil {
		return ferr
	}
	return err
}

// serverErr is err if the server or the connection gave it (the
// transaction is then aborted or gone), nil otherwise.
func serverErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || isUnavailable(err) || errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// serialRows is Query's answer: once its rows are read (Next returned
// false) or it is closed, COMMIT's answer is read, and its error is Err's.
type serialRows struct {
	pgx.Rows
	c    serialConn
	ctx  context.Context
	br   pgx.BatchResults
	done bool
	err  error
}

func (r *serialRows) Next() bool {
	if r.done {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.end()
	return false
}

func (r *serialRows) end() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	r.err = r.c.finish(r.ctx, r.br, r.Rows.Err())
}

func (r *serialRows) Close() { r.end() }

func (r *serialRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Rows.Err()
}

// errRow is a pgx.Row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// serialPool is a Querier over the pool: each statement takes a
// connection and runs as serialConn runs it.
type serialPool struct {
	pool *pgxpool.Pool
}

func (p serialPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer conn.Release()
	return serialConn{conn: conn.Conn()}.Exec(ctx, sql, args...)
}

func (p serialPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return errRow{err}
	}
	return releasingRow{serialConn{conn: conn.Conn()}.QueryRow(ctx, sql, args...), conn}
}

func (p serialPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := serialConn{conn: conn.Conn()}.Query(ctx, sql, args...)
	if err != nil {
		conn.Release()
		return nil, err
	}
	r := rows.(*serialRows)
	return &releasingRows{serialRows: r, conn: conn}, nil
}

// releasingRow releases its connection once scanned.
type releasingRow struct {
	pgx.Row
	conn *pgxpool.Conn
}

func (r releasingRow) Scan(dest ...any) error {
	defer r.conn.Release()
	return r.Row.Scan(dest...)
}

// releasingRows releases its connection once its rows are read or closed.
type releasingRows struct {
	*serialRows
	conn *pgxpool.Conn
}

func (r *releasingRows) Next() bool {
	if r.serialRows.Next() {
		return true
	}
	r.release()
	return false
}

func (r *releasingRows) Close() {
	r.serialRows.Close()
	r.release()
}

func (r *releasingRows) release() {
	if r.conn != nil {
		r.conn.Release()
		r.conn = nil
	}
}

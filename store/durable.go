package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
)

// durable makes what q's connection has read so far durable before a
// request is answered from it (a replay or a conflict decided on a settled
// record).
//
// On PostgreSQL with synchronous standbys (synchronous_standby_names set,
// as Patroni's synchronous mode sets it on the primary), a commit is
// visible to the primary's other sessions before a standby has it. A
// primary cut off from its standbys therefore shows commits it has not
// acknowledged, which are gone once a standby is promoted: a retry
// answered from such a read replays an answer the store then forgets, and
// the next retry finds the record as it was before (found by the
// store-partition chaos scenario: a replay, then the same key in
// progress). So on such a primary, durable writes a transactional WAL
// message on the same connection, as its own transaction: its commit waits
// for the standbys as a write's does, and by then every commit the
// connection read is on them; a primary demoted first fails it instead,
// and the request is not answered. Without standbys it sends nothing (the
// setting is read when the connection is made, checkStandbys, and again
// after syncRecheck), and CockroachDB, whose reads go through consensus,
// needs nothing.
//
// q must be a transaction or a connection (not the pool), so that the
// message goes to the server that was read. Inside a transaction the
// message is part of it, and its COMMIT waits.
func durable(ctx context.Context, q Querier) error {
	c, ok := q.(interface{ Conn() *pgx.Conn })
	if !ok {
		return fmt.Errorf("store: durable read: %T is not a connection or a transaction", q)
	}
	pc := c.Conn().PgConn()
	st, _ := pc.CustomData()[syncStateKey].(syncState)
	if st.cockroach {
		return nil
	}
	if time.Since(st.checked) > syncRecheck {
		var err error
		if st, err = checkStandbys(ctx, c.Conn(), false); err != nil {
			return err
		}
	}
	if !st.standbys {
		return nil
	}
	// synchronous_commit for this transaction only: a session that turned
	// it off would not wait.
	if _, err := q.Exec(ctx, `SELECT set_config('synchronous_commit', 'on', true), pg_logical_emit_message(true, 'idem.durable-read', '')`); err != nil {
		return fmt.Errorf("store: durable read: %w", err)
	}
	return nil
}

// answered reports whether d answers the request from the record it read.
func answered(d idem.Decision) bool {
	return d.Outcome == idem.OutcomeReplay || d.Outcome == idem.OutcomeConflict
}

// syncStateKey keys a connection's syncState in its CustomData.
const syncStateKey = "idem.store.synchronous-standbys"

// syncRecheck is how long a connection trusts what it read of
// synchronous_standby_names. Patroni sets a primary's standbys before
// the cluster takes writes and before it promotes a standby, and every
// connection to a promoted primary is new; a primary given standbys while
// connections to it are open is what the recheck is for.
const syncRecheck = 30 * time.Second

// checkStandbys reads whether conn's server commits wait for synchronous
// standbys, and keeps it in the connection's CustomData (the pool's
// AfterConnect, and durable once syncRecheck has passed). CockroachDB's
// reads go through consensus: nothing to read there.
func checkStandbys(ctx context.Context, conn *pgx.Conn, cockroach bool) (syncState, error) {
	st := syncState{checked: time.Now(), cockroach: cockroach}
	if !cockroach {
		var names string
		// SHOW, not SELECT current_setting: the same value, and a command
		// a proxy watching for commits (tests/commitcut) does not take for one.
		if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
			return syncState{}, fmt.Errorf("store: synchronous standbys: %w", err)
		}
		st.standbys = names != ""
	}
	conn.PgConn().CustomData()[syncStateKey] = st
	return st, nil
}

// syncState is what a connection last read of synchronous_standby_names.
type syncState struct {
	checked   time.Time
	standbys  bool
	cockroach bool
}

// durableDecision passes on a settled read's decision once durable has made
// what q read durable, when the decision answers the request.
func durableDecision(ctx context.Context, q Querier) func(idem.Decision, bool, error) (idem.Decision, bool, error) {
	return func(d idem.Decision, ok bool, err error) (idem.Decision, bool, error) {
		if err == nil && ok && answered(d) {
			if err := durable(ctx, q); err != nil {
				return idem.Decision{}, false, err
			}
		}
		return d, ok, err
	}
}

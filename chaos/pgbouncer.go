package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/cluster"
)

// pgBouncerProbeTimeout bounds one look through PgBouncer or at the
// server behind it.
const pgBouncerProbeTimeout = 2 * time.Second

func hasPgBouncer(c *cluster.Cluster) bool { return c.PgBouncer() != nil }

// checkPgBouncer connects through the cluster's PgBouncer (if it has one)
// to the server behind it: the nodes' store is reachable.
func checkPgBouncer(ctx context.Context, c *cluster.Cluster) error {
	b := c.PgBouncer()
	if b == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, pgBouncerProbeTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.URLFor("postgres"))
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.Ping(ctx); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

type killPgBouncer struct {
	notes
	// hold, if set, is how long each commit of a write to the stores'
	// records or payments is held at the server when PgBouncer is killed.
	hold     time.Duration
	pid      int
	killedAt time.Time
}

// KillPgBouncer kills the PgBouncer every node reaches its store through
// (cluster.Config.PgBouncer) with SIGKILL, as a crash of the pooler: every
// client and server connection drops at once, and with them the
// transactions in flight. New connections are refused until Heal restarts
// it on the same port. The fault notes how many of the server's sessions
// were in a transaction just before the kill.
func KillPgBouncer() Fault { return &killPgBouncer{} }

// KillPgBouncerMidCommit is KillPgBouncer while commits are in flight: it
// first holds every commit of a write to the stores' records or payments
// for hold at the server (a deferred constraint trigger that sleeps once
// per transaction, the time a commit takes when it waits for an fsync or
// a synchronous standby, which the local server, running without either,
// makes vanishingly short), waits until commits are held, and kills
// PgBouncer then. The server finishes the commits held after their
// clients are gone, so each of them is committed without the node
// hearing of it: an ambiguous commit through a pooler, which the node
// must resolve (a claim by its id, a fenced write by reading it back)
// rather than run again. The triggers are dropped once PgBouncer is dead.
// The fault notes how many commits were held at the kill.
func KillPgBouncerMidCommit(hold time.Duration) Fault { return &killPgBouncer{hold: hold} }

func (f *killPgBouncer) Name() string {
	if f.hold > 0 {
		return fmt.Sprintf("kill-pgbouncer(commits held %v)", f.hold)
	}
	return "kill-pgbouncer"
}
func (f *killPgBouncer) Available(c *cluster.Cluster) bool { return hasPgBouncer(c) }
func (f *killPgBouncer) Inject(ctx context.Context, c *cluster.Cluster) error {
	b := c.PgBouncer()
	var dbs []string
	if f.hold > 0 {
		var err error
		if dbs, err = storeDatabases(c); err != nil {
			return err
		}
		defer func() {
			// After the kill: the held commits finish, and later ones no
			// longer wait.
			if err := releaseCommits(context.WithoutCancel(ctx), c, dbs); err != nil {
				f.note("release the held commits: %v", err)
			}
		}()
		if err := holdCommits(ctx, c, dbs, f.hold); err != nil {
			return err
		}
		held, what, err := waitHeldCommits(ctx, c, dbs, f.hold)
		if err != nil {
			return err
		}
		f.note("%d commits held at the server when PgBouncer was killed", held)
		if len(what) > 0 {
			f.note("held: %s", strings.Join(what, "; "))
		}
	} else if n, err := openTransactions(ctx, c); err == nil {
		f.note("%d server sessions in a transaction just before the kill", n)
	}
	f.pid, f.killedAt = b.Pid(), time.Now()
	b.Kill()
	f.note("killed pid %d", f.pid)
	return nil
}
func (f *killPgBouncer) Heal(ctx context.Context, c *cluster.Cluster) error {
	b := c.PgBouncer()
	if err := b.Restart(ctx); err != nil {
		return fmt.Errorf("chaos: restart PgBouncer: %w", err)
	}
	f.note("restarted as pid %d, %v after the kill", b.Pid(), time.Since(f.killedAt).Round(time.Millisecond))
	return nil
}

// serverConn connects to database db of the server behind PgBouncer,
// directly.
func serverConn(ctx context.Context, c *cluster.Cluster, db string) (*pgx.Conn, error) {
	info := c.Info().PgBouncer
	if info == nil {
		return nil, errors.New("chaos: no PgBouncer")
	}
	u, err := url.Parse(info.ServerURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: the server behind PgBouncer: %w", err)
	}
	u.Path = "/" + db
	return pgx.Connect(ctx, u.String())
}

// openTransactions counts the sessions of the server behind PgBouncer,
// asked directly, that are in a transaction: active in one, or idle in one
// between its statements.
func openTransactions(ctx context.Context, c *cluster.Cluster) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, pgBouncerProbeTimeout)
	defer cancel()
	conn, err := serverConn(ctx, c, "postgres")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`).Scan(&n)
	return n, err
}

// storeDatabases returns the databases of the cluster's stores (a region's,
// or the global one), as the nodes' URLs name them.
func storeDatabases(c *cluster.Cluster) ([]string, error) {
	var dbs []string
	for _, r := range c.Info().Regions {
		u, err := url.Parse(r.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("chaos: %s's database URL: %w", r.Name, err)
		}
		if db := strings.TrimPrefix(u.Path, "/"); !slices.Contains(dbs, db) {
			dbs = append(dbs, db)
		}
	}
	return dbs, nil
}

// heldTables are the tables whose writes have their commit held.
var heldTables = []string{"idempotency_records", "payments"}

// holdCommitSQL makes every commit of a transaction that wrote a held
// table sleep for %s seconds first, once per transaction: a deferred
// constraint trigger runs at COMMIT, and the server does not notice
// meanwhile that its client has gone.
const holdCommitSQL = `CREATE OR REPLACE FUNCTION chaos_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('chaos.held', true) IS DISTINCT FROM 'on' THEN
		PERFORM set_config('chaos.held', 'on', true);
		PERFORM pg_sleep(%s);
	END IF;
	RETURN NULL;
END $$`

// holdCommits installs the commit hold in every database of dbs.
func holdCommits(ctx context.Context, c *cluster.Cluster, dbs []string, hold time.Duration) error {
	for _, db := range dbs {
		err := func() error {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			conn, err := serverConn(ctx, c, db)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			stmts := []string{fmt.Sprintf(holdCommitSQL, strconv.FormatFloat(hold.Seconds(), 'f', 3, 64))}
			for _, t := range heldTables {
				stmts = append(stmts, "DROP TRIGGER IF EXISTS chaos_hold_commit ON "+t,
					"CREATE CONSTRAINT TRIGGER chaos_hold_commit AFTER INSERT OR UPDATE ON "+t+
						" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_hold_commit()")
			}
			for _, q := range stmts {
				if _, err := conn.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("chaos: hold the commits of %s: %w", db, err)
		}
	}
	return nil
}

// releaseCommits drops the commit hold from every database of dbs; it
// waits for the commits held (their transactions keep the tables locked
// against the DROP).
func releaseCommits(ctx context.Context, c *cluster.Cluster, dbs []string) error {
	var errs []error
	for _, db := range dbs {
		err := func() error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			conn, err := serverConn(ctx, c, db)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			for _, t := range heldTables {
				if _, err := conn.Exec(ctx, "DROP TRIGGER IF EXISTS chaos_hold_commit ON "+t); err != nil {
					return err
				}
			}
			_, err = conn.Exec(ctx, "DROP FUNCTION IF EXISTS chaos_hold_commit()")
			return err
		}()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", db, err))
		}
	}
	return errors.Join(errs...)
}

// waitHeldCommits waits until commits are held at the server (sessions
// sleeping in the hold), at most half of hold, so that the kill falls while
// they are, and returns how many are and what they wrote: per database,
// how many held transactions wrote each set of tables.
func waitHeldCommits(ctx context.Context, c *cluster.Cluster, dbs []string, hold time.Duration) (int, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, pgBouncerProbeTimeout+hold)
	defer cancel()
	conns := make([]*pgx.Conn, 0, len(dbs))
	defer func() {
		for _, conn := range conns {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for _, db := range dbs {
		conn, err := serverConn(ctx, c, db)
		if err != nil {
			return 0, nil, fmt.Errorf("chaos: count the held commits: %w", err)
		}
		conns = append(conns, conn)
	}
	deadline := time.Now().Add(hold / 2)
	for {
		n, what := 0, []string(nil)
		for i, conn := range conns {
			held, err := heldWrites(ctx, conn)
			if err != nil {
				return 0, nil, fmt.Errorf("chaos: count the held commits: %w", err)
			}
			for _, h := range held {
				n += h.count
				what = append(what, fmt.Sprintf("%s %d× writing %s", dbs[i], h.count, h.tables))
			}
		}
		if n > 0 && time.Now().After(deadline) || time.Now().After(deadline.Add(hold/4)) {
			return n, what, nil
		}
		select {
		case <-ctx.Done():
			return n, what, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// heldWrite is how many held transactions of a database wrote tables.
type heldWrite struct {
	tables string
	count  int
}

// heldWrites returns the held transactions of conn's database, grouped by
// the tables each wrote (those it holds ROW EXCLUSIVE locks on).
func heldWrites(ctx context.Context, conn *pgx.Conn) ([]heldWrite, error) {
	rows, err := conn.Query(ctx, `SELECT tables, count(*) FROM (
			SELECT a.pid, coalesce(string_agg(DISTINCT c.relname, '+' ORDER BY c.relname), '?') AS tables
			FROM pg_stat_activity a
			LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
			LEFT JOIN pg_class c ON c.oid = l.relation AND c.relkind = 'r'
			WHERE a.wait_event = 'PgSleep' AND a.datname = current_database()
			GROUP BY a.pid) held
		GROUP BY tables ORDER BY 2 DESC, 1`)
	if err != nil {
		return nil, err
	}
	var out []heldWrite
	for rows.Next() {
		var h heldWrite
		if err := rows.Scan(&h.tables, &h.count); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

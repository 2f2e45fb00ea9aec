package ambiguous_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/logtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
	"github.com/idemcoord/idem/tests/commitcut"
)

// The tests of this file reproduce at the wire what CockroachDB does to a
// client and PostgreSQL never does: a commit answered 40003 ("result is
// ambiguous") although it committed, a RELEASE SAVEPOINT cockroach_restart
// (cockroach-go's commit) that commits and is answered 40003 or not at all,
// and storms of 40001. The store is opened with store.ServerCockroach where
// the test is about the CockroachDB path: its transactions then run through
// crdbpgx.ExecuteTx, which PostgreSQL runs too.

// faultStore opens a store on dbURL's database through a fault proxy,
// talking to it as server.
func faultStore(t *testing.T, dbURL string, opts store.Options) (*store.Store, *commitcut.Cut, *logtest.Messages) {
	t.Helper()
	cut := commitcut.New(t, dbURL)
	log := &logtest.Messages{}
	if opts.MaxConns == 0 {
		opts.MaxConns = 4
	}
	opts.Logger = slog.New(log)
	st, err := store.Open(context.Background(), cut.URL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, cut, log
}

// injected fails the test unless done is closed: the fault happened.
func injected(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	default:
		t.Fatalf("%s never happened; the test injected nothing", what)
	}
}

// unknown fails the test unless err is an unknown commit outcome as the
// store reports it: ErrCommitUnknown in a STORE_UNAVAILABLE *idem.Error.
func unknown(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrCommitUnknown) || idem.ErrorCode(err) != idem.ECodeStoreUnavailable {
		t.Fatalf("err = %v, want store.ErrCommitUnknown as STORE_UNAVAILABLE", err)
	}
}

// effects is a table of the test's own, whose rows count how often a
// transaction's write committed.
func effects(t *testing.T, direct *store.Store) func() int {
	t.Helper()
	storetest.Exec(t, direct, `CREATE TABLE ambiguous_effects (id TEXT NOT NULL)`)
	return func() int { return storetest.Count(t, direct, `SELECT count(*) FROM ambiguous_effects`) }
}

// insertEffect is a transaction's body: one row, and a count of its runs.
func insertEffect(runs *atomic.Int32) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		runs.Add(1)
		_, err := tx.Exec(context.Background(), `INSERT INTO ambiguous_effects (id) VALUES ($1)`, "e")
		return err
	}
}

// TestClaimCommitAnsweredAmbiguous: the claim's COMMIT (the one-statement
// claim of a free key, store.ExecOne's batch) and the completion's are
// answered 40003 while the store commits each: the claim is resolved by
// its claim id and the completion read back, so the request executes
// exactly once and answers what that execution answered; a retry replays.
func TestClaimCommitAnsweredAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		name    string
		commit  int // which COMMIT of the request is answered 40003
		resolve string
	}{
		{"claim", 1, "resolving it by its claim id"},
		{"completion", 2, "reading it back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			st, cut, log := faultStore(t, dbURL, store.Options{})
			var c counting
			e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
			h := hashes(t, map[string]any{"amount": 3})

			done := cut.ArmFault(commitcut.AmbiguousCommit, tc.commit)
			ans, err := e.Do(ctx, request("k-"+tc.name, h))
			injected(t, done, "a COMMIT answered 40003")
			if err != nil {
				t.Fatalf("Do with COMMIT %d answered 40003 = %v, want the executed answer", tc.commit, err)
			}
			if !log.Has(tc.resolve) {
				t.Errorf("the store never logged %q: the ambiguous commit was not resolved as one", tc.resolve)
			}
			executedOnce(ctx, t, e, direct, &c, "k-"+tc.name, h, ans)
		})
	}
}

// TestClaimReleaseAmbiguous: on the CockroachDB path a claim that takes
// over a record (here one left FAILED_RETRYABLE) is a transaction through
// crdbpgx.ExecuteTx, whose commit is RELEASE SAVEPOINT cockroach_restart.
// That RELEASE commits and is answered 40003, or commits and its answer
// is lost with the connection: the claim is resolved by its claim id, the
// operation runs exactly once, and a retry replays it.
func TestClaimReleaseAmbiguous(t *testing.T) {
	for _, f := range []commitcut.Fault{commitcut.AmbiguousRelease, commitcut.CutRelease} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			h := hashes(t, map[string]any{"amount": 4})
			key := "k-" + f.String()
			// A first attempt that did nothing and said so leaves the key
			// FAILED_RETRYABLE: the next claim takes the record over.
			failing := newEngine(t, direct, engine.Options{}, engine.Operation{Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
				return engine.Result{}, engine.Retryable(errors.New("provider unreachable"))
			}})
			if _, err := failing.Do(ctx, request(key, h)); err == nil {
				t.Fatal("the failing attempt succeeded")
			}
			if rec := record(t, direct, key); rec.Status != idem.StatusFailedRetryable {
				t.Fatalf("record after the failing attempt = %s, want FAILED_RETRYABLE", rec.Status)
			}

			st, cut, log := faultStore(t, dbURL, store.Options{Server: store.ServerCockroach})
			var c counting
			e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute, Recover: c.execute})
			done := cut.ArmFault(f, 1)
			ans, err := e.Do(ctx, request(key, h))
			injected(t, done, "the takeover's RELEASE "+f.String())
			if err != nil {
				t.Fatalf("Do with the takeover's RELEASE %s = %v, want the executed answer", f, err)
			}
			if !log.Has("resolving it by its claim id") {
				t.Error("the claim was not resolved by its claim id")
			}
			if n := c.n.Load(); n != 1 {
				t.Fatalf("executions = %d, want 1", n)
			}
			rec := record(t, direct, key)
			if rec.Status != idem.StatusCompleted || rec.Response == nil || !bytes.Equal(rec.Response.Body, ans.Response.Body) || rec.Attempts != 2 {
				t.Errorf("record = %s attempts %d %v, want COMPLETED at its second attempt with the answer given", rec.Status, rec.Attempts, rec.Response)
			}
			again, err := e.Do(ctx, request(key, h))
			if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, ans.Response.Body) {
				t.Errorf("retry = %+v, %v; want a replay of the first answer", again, err)
			}
			if n := c.n.Load(); n != 1 {
				t.Errorf("executions after the retry = %d, want 1", n)
			}
		})
	}
}

// TestFencedWriteReadsBack: a completion (a fenced write, one statement)
// whose COMMIT is answered 40003 is read back and found written, under
// either server.
func TestFencedWriteReadsBack(t *testing.T) {
	for _, server := range []store.Server{store.ServerPostgres, store.ServerCockroach} {
		t.Run(server.String(), func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			st, cut, log := faultStore(t, dbURL, store.Options{Server: server})
			req := idem.BeginRequest{Scope: idem.Scope{Tenant: tenant, Operation: opName, Key: "k-fenced"},
				RequestHashes: hashes(t, map[string]any{"amount": 5}), Owner: "o", LockFor: 30e9, Window: 3600e9, HomeRegion: "local"}
			d, err := st.Begin(ctx, req)
			if err != nil || d.Outcome != idem.OutcomeExecute {
				t.Fatalf("Begin = %+v, %v", d, err)
			}
			done := cut.ArmFault(commitcut.AmbiguousCommit, 1)
			err = st.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(`{"ok":true}`)}})
			injected(t, done, "the completion's COMMIT answered 40003")
			if err != nil {
				t.Fatalf("Complete with its COMMIT answered 40003 = %v, want nil (read back)", err)
			}
			if !log.Has("reading it back") {
				t.Error("the completion was not read back")
			}
			if rec := record(t, direct, "k-fenced"); rec.Status != idem.StatusCompleted || rec.FencingToken != d.Lease.Token {
				t.Errorf("record = %s token %d, want COMPLETED under the lease", rec.Status, rec.FencingToken)
			}
		})
	}
}

// TestExecOneAmbiguous: a one-statement write (store.ExecOne: BEGIN, the
// statement and COMMIT in one round trip, what CockroachDB would run as an
// implicit transaction) whose COMMIT is answered 40003 reports
// ErrCommitUnknown, and is not run again: its write committed once.
func TestExecOneAmbiguous(t *testing.T) {
	ctx := ctxOf(t)
	direct, dbURL := storetest.New(t)
	rows := effects(t, direct)
	st, cut, _ := faultStore(t, dbURL, store.Options{Server: store.ServerCockroach})
	var runs atomic.Int32
	done := cut.ArmFault(commitcut.AmbiguousCommit, 1)
	err := st.ExecOne(ctx, func(q store.Querier) error {
		runs.Add(1)
		_, err := q.Exec(ctx, `INSERT INTO ambiguous_effects (id) VALUES ($1)`, "e")
		return err
	})
	injected(t, done, "the statement's COMMIT answered 40003")
	unknown(t, err)
	if n := runs.Load(); n != 1 {
		t.Errorf("runs = %d, want 1 (an ambiguous commit is not retried blindly)", n)
	}
	if n := rows(); n != 1 {
		t.Errorf("rows = %d, want 1", n)
	}
}

// TestExecTxAmbiguous: a transaction whose commit is ambiguous reports
// ErrCommitUnknown and is not run again: on PostgreSQL its COMMIT answered
// 40003; on CockroachDB (crdbpgx.ExecuteTx) its RELEASE SAVEPOINT answered
// 40003 or lost with the connection, and its COMMIT answered 40003.
func TestExecTxAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		server store.Server
		fault  commitcut.Fault
	}{
		{store.ServerPostgres, commitcut.AmbiguousCommit},
		{store.ServerCockroach, commitcut.AmbiguousRelease},
		{store.ServerCockroach, commitcut.CutRelease},
		{store.ServerCockroach, commitcut.AmbiguousCommit},
	} {
		t.Run(tc.server.String()+"/"+tc.fault.String(), func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			rows := effects(t, direct)
			st, cut, _ := faultStore(t, dbURL, store.Options{Server: tc.server})
			var runs atomic.Int32
			done := cut.ArmFault(tc.fault, 1)
			err := st.ExecTx(ctx, insertEffect(&runs))
			injected(t, done, tc.fault.String())
			unknown(t, err)
			if n := runs.Load(); n != 1 {
				t.Errorf("runs = %d, want 1 (an ambiguous commit is not retried blindly)", n)
			}
			if n := rows(); n != 1 {
				t.Errorf("rows = %d, want 1", n)
			}
		})
	}
}

// TestRetryStorm: every commit of a transaction is answered 40001 (the
// server's transaction really fails): the store gives up after
// Options.TxAttempts transactions with its classified error, STORE_UNAVAILABLE
// "contended", having committed nothing; on CockroachDB each transaction
// is retried once more from its savepoint by crdbpgx (a 40001 at RELEASE),
// so the storm answers twice as many. A storm shorter than that ends in
// one commit.
func TestRetryStorm(t *testing.T) {
	const attempts = 3
	for _, tc := range []struct {
		name     string
		server   store.Server
		prefix   string // the statements the storm answers
		perTx    int    // storm answers per transaction
		execOne  bool
		runsEach int // runs of the body per storm answer
	}{
		{"cockroach release", store.ServerCockroach, "RELEASE SAVEPOINT cockroach_restart", 2, false, 1},
		{"postgres commit", store.ServerPostgres, "COMMIT", 1, false, 1},
		{"one statement", store.ServerCockroach, "INSERT INTO ambiguous_effects", 1, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxOf(t)
			direct, dbURL := storetest.New(t)
			rows := effects(t, direct)
			st, cut, _ := faultStore(t, dbURL, store.Options{Server: tc.server, TxAttempts: attempts})
			var runs atomic.Int32
			write := func() error {
				if tc.execOne {
					return st.ExecOne(ctx, func(q store.Querier) error {
						runs.Add(1)
						_, err := q.Exec(ctx, `INSERT INTO ambiguous_effects (id) VALUES ($1)`, "e")
						return err
					})
				}
				return st.ExecTx(ctx, insertEffect(&runs))
			}

			cut.Storm(tc.prefix, -1)
			err := write()
			var ie *idem.Error
			if !errors.As(err, &ie) || ie.Code != idem.ECodeStoreUnavailable || !strings.Contains(ie.Message, "contended") {
				t.Fatalf("err = %v, want STORE_UNAVAILABLE contended", err)
			}
			if errors.Is(err, store.ErrCommitUnknown) {
				t.Errorf("err = %v: a 40001 is a definite abort, not an unknown outcome", err)
			}
			if got, want := cut.Stormed(), attempts*tc.perTx; got != want {
				t.Errorf("storm answered %d statements, want %d (%d transactions)", got, want, attempts)
			}
			if n := rows(); n != 0 {
				t.Errorf("rows = %d after the storm, want 0", n)
			}

			// A storm one answer short of giving up: one commit.
			runs.Store(0)
			short := attempts*tc.perTx - 1
			quiet := cut.Storm(tc.prefix, short)
			if err := write(); err != nil {
				t.Fatalf("write through a storm of %d = %v, want success", short, err)
			}
			injected(t, quiet, "the short storm")
			if n := rows(); n != 1 {
				t.Errorf("rows = %d, want 1", n)
			}
			if n := int(runs.Load()); n != short+1 {
				t.Errorf("runs = %d, want %d", n, short+1)
			}
		})
	}
}

// TestClaimStorm: on the CockroachDB path, a claim that takes a record over
// meets a storm of 40001 at every RELEASE: the request answers
// STORE_UNAVAILABLE (retry with the same key) without executing, and once
// the storm is over the retry executes exactly once.
func TestClaimStorm(t *testing.T) {
	ctx := ctxOf(t)
	direct, dbURL := storetest.New(t)
	h := hashes(t, map[string]any{"amount": 6})
	failing := newEngine(t, direct, engine.Options{}, engine.Operation{Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
		return engine.Result{}, engine.Retryable(errors.New("provider unreachable"))
	}})
	if _, err := failing.Do(ctx, request("k-storm", h)); err == nil {
		t.Fatal("the failing attempt succeeded")
	}
	st, cut, _ := faultStore(t, dbURL, store.Options{Server: store.ServerCockroach, TxAttempts: 3})
	var c counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute, Recover: c.execute})
	cut.Storm("RELEASE SAVEPOINT cockroach_restart", -1)
	_, err := e.Do(ctx, request("k-storm", h))
	if idem.ErrorCode(err) != idem.ECodeStoreUnavailable {
		t.Fatalf("Do in a storm = %v, want STORE_UNAVAILABLE", err)
	}
	if n := c.n.Load(); n != 0 {
		t.Fatalf("executions in the storm = %d, want 0", n)
	}
	if cut.Stormed() == 0 {
		t.Fatal("the storm answered nothing; the test injected nothing")
	}
	cut.Storm("", 0)
	ans, err := e.Do(ctx, request("k-storm", h))
	if err != nil || ans.Status != idem.StatusCompleted {
		t.Fatalf("Do after the storm = %+v, %v", ans, err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}

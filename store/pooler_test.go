package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/internal/pgbouncer"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// TestPgBouncerSerializable: behind PgBouncer in transaction pooling,
// whose server connections carry whatever session state earlier clients
// left on them, every kind of store transaction (ExecTx, a one-statement
// ExecOne, a Read) still runs SERIALIZABLE, and a write skew between two
// concurrent transactions is refused as SERIALIZABLE refuses it.
func TestPgBouncerSerializable(t *testing.T) {
	const servers = 4
	bouncer := pgtest.NewPgBouncer(t, pgbouncer.ModeTransaction, servers)
	url, err := bouncer.Via(pgtest.NewDirectDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Leave every server connection of the pool set to READ UNCOMMITTED
	// (read committed, on PostgreSQL) by default, as a careless client of
	// the same pooler would: each holds a transaction so that each gets a
	// server connection of its own, and the SET outlives its COMMIT.
	var clients []*pgx.Conn
	for range servers {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SET SESSION default_transaction_isolation = 'read uncommitted'`); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	for _, c := range clients {
		if _, err := c.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
	}
	var leaked string
	if err := clients[0].QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&leaked); err != nil || leaked != "read uncommitted" {
		t.Fatalf("the pooler's server connection's default = %q, %v; want the leaked read uncommitted", leaked, err)
	}

	st, _ := storetest.Open(t, url)
	show := func(q store.Querier) (string, error) {
		var got string
		err := q.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got)
		return got, err
	}
	for name, run := range map[string]func() (string, error){
		"ExecTx": func() (got string, err error) {
			err = st.ExecTx(ctx, func(tx pgx.Tx) error { got, err = show(tx); return err })
			return got, err
		},
		"ExecOne": func() (got string, err error) {
			err = st.ExecOne(ctx, func(q store.Querier) error { got, err = show(q); return err })
			return got, err
		},
		"Read": func() (got string, err error) {
			err = st.Read(ctx, func(q store.Querier) error { got, err = show(q); return err })
			return got, err
		},
	} {
		for range 2 * servers { // every server connection, by turns
			got, err := run()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != "serializable" {
				t.Fatalf("%s ran at %q through the pooler, want serializable", name, got)
			}
		}
	}

	// Write skew: each transaction inserts a row only if it reads none. At
	// SERIALIZABLE one of two that overlap fails (40001), is run again by
	// ExecTx, and then finds the other's row: one row in all. Below it,
	// both insert.
	storetest.Exec(t, st, `CREATE TABLE on_call (doctor TEXT PRIMARY KEY)`)
	var (
		wg      sync.WaitGroup
		barrier sync.WaitGroup
	)
	barrier.Add(2)
	for _, doctor := range []string{"alice", "bob"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			err := st.ExecTx(ctx, func(tx pgx.Tx) error {
				var n int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM on_call`).Scan(&n); err != nil {
					return err
				}
				if first { // both have read before either writes
					first = false
					barrier.Done()
					barrier.Wait()
				}
				if n > 0 {
					return nil
				}
				_, err := tx.Exec(ctx, `INSERT INTO on_call VALUES ($1)`, doctor)
				return err
			})
			if err != nil {
				t.Errorf("%s: %v", doctor, err)
			}
		}()
	}
	wg.Wait()
	if n := storetest.Count(t, st, `SELECT count(*) FROM on_call`); n != 1 {
		t.Errorf("%d doctors on call after two overlapping transactions, want 1 (a write skew got through)", n)
	}
}

// TestPgBouncerStatementPoolingRefused: a pooler that runs no
// transactions (PgBouncer in statement pooling) is refused at the first
// connection, naming the pool mode to use.
func TestPgBouncerStatementPoolingRefused(t *testing.T) {
	bouncer := pgtest.NewPgBouncer(t, pgbouncer.ModeStatement, 2)
	url, err := bouncer.Via(pgtest.NewDirectDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.Ping(context.Background())
	if err == nil {
		t.Fatal("Ping through a statement pooler succeeded, want it refused")
	}
	if !strings.Contains(err.Error(), "pool_mode = transaction") {
		t.Errorf("Ping = %v, want the refusal to name transaction pooling", err)
	}
}

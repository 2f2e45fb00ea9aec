package payments_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

func openEmpty(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), pgtest.NewDatabase(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func tableExists(t *testing.T, st *store.Store, name string) bool {
	t.Helper()
	return storetest.Count(t, st, `SELECT count(*) FROM information_schema.tables WHERE table_name = $1`, name) == 1
}

// TestEngineMigratesOnlyItsTables: the store's own migrations create the
// idempotency records and nothing of the payments domain; payments.Migrate
// installs the domain's tables.
func TestEngineMigratesOnlyItsTables(t *testing.T) {
	ctx := context.Background()
	st := openEmpty(t)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	domain := []string{"payments", "outbox_events", "queue_messages", "consumer_inbox", "ledger_entries", "email_notifications"}
	if !tableExists(t, st, "idempotency_records") {
		t.Fatal("the engine's migrations did not create idempotency_records")
	}
	for _, table := range domain {
		if tableExists(t, st, table) {
			t.Errorf("the engine's migrations created the payments domain's table %s", table)
		}
	}
	if err := st.CheckMigrated(ctx); err != nil {
		t.Errorf("engine-only CheckMigrated: %v", err)
	}
	if err := payments.CheckMigrated(ctx, st); err == nil || !strings.Contains(err.Error(), "0002_payments.sql") {
		t.Errorf("payments.CheckMigrated before payments.Migrate = %v, want the missing migrations named", err)
	}
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	for _, table := range domain {
		if !tableExists(t, st, table) {
			t.Errorf("payments.Migrate did not create %s", table)
		}
	}
	if err := payments.CheckMigrated(ctx, st); err != nil {
		t.Errorf("payments.CheckMigrated: %v", err)
	}
}

// TestMigrateRecognisesEarlierDatabases: a database migrated when every
// migration was the store's (versions 1 to 3 recorded under their file
// names) is recognised: nothing is applied twice, only what came later.
func TestMigrateRecognisesEarlierDatabases(t *testing.T) {
	ctx := context.Background()
	st := openEmpty(t)
	storetest.Exec(t, st, `CREATE TABLE schema_migrations (version INT NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	total := 0 // migrations of both sets
	for _, set := range []store.Migrations{store.EngineMigrations(), payments.Migrations()} {
		files, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		total += len(files)
		for i, f := range files {
			if set.Name == "engine" && i > 0 {
				break // the earlier code had only 0001 of the engine's
			}
			body, err := fs.ReadFile(set.FS, f)
			if err != nil {
				t.Fatal(err)
			}
			storetest.Exec(t, st, string(body))
			storetest.Exec(t, st, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, int(f[3]-'0'), f)
		}
	}
	// Only the engine's later migrations are missing; applying 1 to 3 again would
	// fail on their CREATE statements' names.
	if err := payments.CheckMigrated(ctx, st); err == nil || !strings.Contains(err.Error(), "0006_cleanup_indexes.sql") ||
		strings.Contains(err.Error(), "0001") || strings.Contains(err.Error(), "0002") || strings.Contains(err.Error(), "0003") {
		t.Fatalf("CheckMigrated on an earlier database: %v; want only the migrations after 0003 missing", err)
	}
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatalf("Migrate on an earlier database: %v", err)
	}
	if err := payments.CheckMigrated(ctx, st); err != nil {
		t.Fatalf("CheckMigrated after migrating an earlier database: %v", err)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM schema_migrations`); n != total || total < 9 {
		t.Errorf("schema_migrations has %d rows, want one per migration (%d)", n, total)
	}
}

// TestMigrateRefusesAnotherSchema: a version applied under another file
// name is not this code's migration; Migrate and CheckMigrated say so
// rather than skip it.
func TestMigrateRefusesAnotherSchema(t *testing.T) {
	ctx := context.Background()
	st := openEmpty(t)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `INSERT INTO schema_migrations (version, name) VALUES (2, '0002_something_else.sql')`)
	if err := payments.Migrate(ctx, st); err == nil || !strings.Contains(err.Error(), "0002_something_else.sql") {
		t.Errorf("Migrate = %v, want version 2 refused as applied under another name", err)
	}
	if err := payments.CheckMigrated(ctx, st); err == nil || !strings.Contains(err.Error(), "0002_something_else.sql") {
		t.Errorf("CheckMigrated = %v, want version 2 refused as applied under another name", err)
	}
	if tableExists(t, st, "payments") {
		t.Error("Migrate applied 0002_payments.sql over a foreign version 2")
	}
}

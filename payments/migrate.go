package payments

import (
	"context"
	"embed"
	"io/fs"

	"github.com/idemcoord/idem/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations are the payments domain's tables: payments, the outbox, the
// queue and consumers' inbox, and the consumers' effects (ledger entries,
// receipt emails). The set is named "payments": its versions are its own,
// beside the engine's set (store.EngineMigrations) in schema_migrations.
func Migrations() store.Migrations {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err) // the embedded directory exists
	}
	return store.Migrations{Name: "payments", FS: sub}
}

// Migrate applies the engine's migrations and the payments domain's, as the
// schema's owner.
func Migrate(ctx context.Context, st *store.Store) error {
	return st.Migrate(ctx, Migrations())
}

// CheckMigrated returns an error unless the engine's migrations and the
// payments domain's have been applied.
func CheckMigrated(ctx context.Context, st *store.Store) error {
	return st.CheckMigrated(ctx, Migrations())
}

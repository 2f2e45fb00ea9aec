package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies every migration not yet applied. It is safe to run from
// several processes at once: each migration is claimed by inserting its
// version into schema_migrations first (insert-first, like every claim in this
// project), and applied in the same transaction.
func (s *Store) Migrate(ctx context.Context) error {
	const ddl = `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INT         NOT NULL PRIMARY KEY,
		name       TEXT        NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`
	// Concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL's
	// catalog; a unique violation or "already exists" there means another
	// process won, which is what we wanted.
	if _, err := s.pool.Exec(ctx, ddl); err != nil {
		switch sqlState(err) {
		case codeUniqueViolation, "42710", "42P07":
		default:
			return fmt.Errorf("store: create schema_migrations: %w", unavailableOr(err))
		}
	}
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("store: list migrations: %w", err)
	}
	sort.Strings(files)
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("store: migration %s: bad version prefix: %w", base, err)
		}
		body, err := migrationFS.ReadFile(f)
		if err != nil {
			return fmt.Errorf("store: read migration %s: %w", base, err)
		}
		err = s.ExecTx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, version, base)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return nil // applied already, or by a concurrent process
			}
			_, err = tx.Exec(ctx, string(body))
			return err
		})
		if err != nil {
			return fmt.Errorf("store: apply migration %s: %w", base, err)
		}
	}
	return nil
}

func unavailableOr(err error) error {
	if isUnavailable(err) {
		return unavailable(err)
	}
	return err
}

// CheckMigrated returns an error, naming what is missing, unless every
// migration has been applied. A node that must not run DDL (its role may
// only read and write rows) calls it at start instead of Migrate.
func (s *Store) CheckMigrated(ctx context.Context) error {
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("store: list migrations: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		if sqlState(err) == "42P01" { // undefined_table
			return fmt.Errorf("store: no migration has been applied (run idemctl migrate as the schema's owner): %w", err)
		}
		return fmt.Errorf("store: read schema_migrations: %w", unavailableOr(err))
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("store: read schema_migrations: %w", unavailableOr(err))
	}
	var missing []string
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("store: migration %s: bad version prefix: %w", base, err)
		}
		if !slices.Contains(applied, version) {
			missing = append(missing, base)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("store: migrations not applied (run idemctl migrate as the schema's owner): %s", strings.Join(missing, ", "))
	}
	return nil
}

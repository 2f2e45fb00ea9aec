package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is one set of schema migrations: files named
// <version>_<name>.sql at the root of FS. The engine's set creates the
// idempotency records (EngineMigrations); an operation with tables of its
// own ships its set and installs it with Migrate.
//
// Every set shares schema_migrations and one sequence of versions: a set
// owns its versions, a version is applied once whichever set brings it, and
// a version already applied under another file name is refused rather than
// skipped. That is how a database migrated when every migration was the
// store's is recognised: the files kept their versions and names when they
// moved to the sets they belong to.
type Migrations struct {
	// Name names the set in errors ("engine", an operation's name).
	Name string
	// FS holds the set's .sql files at its root.
	FS fs.FS
}

// EngineMigrations are the engine's own tables: the idempotency records.
func EngineMigrations() Migrations {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err) // the embedded directory exists
	}
	return Migrations{Name: "engine", FS: sub}
}

// migration is one file of a set.
type migration struct {
	version int
	name    string // the file name, as recorded in schema_migrations
	set     string
	body    []byte
}

// collect reads the engine's set and sets, in version order. Two files with
// one version are refused.
func collect(sets []Migrations) ([]migration, error) {
	var all []migration
	seen := map[int]migration{}
	for _, set := range append([]Migrations{EngineMigrations()}, sets...) {
		files, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			return nil, fmt.Errorf("store: list %s migrations: %w", set.Name, err)
		}
		for _, f := range files {
			version, err := strconv.Atoi(strings.SplitN(f, "_", 2)[0])
			if err != nil {
				return nil, fmt.Errorf("store: %s migration %s: bad version prefix: %w", set.Name, f, err)
			}
			if other, ok := seen[version]; ok {
				if other.name == f && other.set == set.Name {
					continue // the same set given twice
				}
				return nil, fmt.Errorf("store: migration version %d is both %s's %s and %s's %s", version, other.set, other.name, set.Name, f)
			}
			body, err := fs.ReadFile(set.FS, f)
			if err != nil {
				return nil, fmt.Errorf("store: read %s migration %s: %w", set.Name, f, err)
			}
			m := migration{version: version, name: f, set: set.Name, body: body}
			seen[version] = m
			all = append(all, m)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].version < all[j].version })
	return all, nil
}

// Migrate applies every migration of the engine's set and of sets (an
// operation's own tables) not yet applied, in
// version order. It is safe to run from several processes at once: each
// migration is claimed by inserting its version into schema_migrations
// first (insert-first, like every claim in this project), and applied in
// the same transaction.
func (s *Store) Migrate(ctx context.Context, sets ...Migrations) error {
	const ddl = `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INT         NOT NULL PRIMARY KEY,
		name       TEXT        NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`
	migrations, err := collect(sets)
	if err != nil {
		return err
	}
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
	for _, m := range migrations {
		err = s.ExecTx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, m.version, m.name)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				// Applied already, or by a concurrent process: under
				// this name, or the database is not this code's.
				var applied string
				if err := tx.QueryRow(ctx, `SELECT name FROM schema_migrations WHERE version = $1`, m.version).Scan(&applied); err != nil {
					return err
				}
				if applied != m.name {
					return fmt.Errorf("version %d is applied as %s, not %s", m.version, applied, m.name)
				}
				return nil
			}
			_, err = tx.Exec(ctx, string(m.body))
			return err
		})
		if err != nil {
			return fmt.Errorf("store: apply %s migration %s: %w", m.set, m.name, err)
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
// migration of the engine's set and of sets has been applied (under its
// name). A node that must not run DDL (its role may only read and write
// rows) calls it at start instead of Migrate.
func (s *Store) CheckMigrated(ctx context.Context, sets ...Migrations) error {
	migrations, err := collect(sets)
	if err != nil {
		return err
	}
	rows, err := s.pool.Query(ctx, `SELECT version, name FROM schema_migrations`)
	if err != nil {
		if sqlState(err) == "42P01" { // undefined_table
			return fmt.Errorf("store: no migration has been applied (run idemctl migrate as the schema's owner): %w", err)
		}
		return fmt.Errorf("store: read schema_migrations: %w", unavailableOr(err))
	}
	applied := map[int]string{}
	var (
		version int
		name    string
	)
	_, err = pgx.ForEachRow(rows, []any{&version, &name}, func() error {
		applied[version] = name
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: read schema_migrations: %w", unavailableOr(err))
	}
	var missing []string
	for _, m := range migrations {
		switch got, ok := applied[m.version]; {
		case !ok:
			missing = append(missing, m.name)
		case got != m.name:
			return fmt.Errorf("store: migration version %d is applied as %s, not %s", m.version, got, m.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("store: migrations not applied (run idemctl migrate as the schema's owner): %s", strings.Join(missing, ", "))
	}
	return nil
}

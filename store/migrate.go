package store

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is one set of schema migrations: files named
// <version>_<name>.sql at the root of FS. The engine's set creates the
// idempotency records (EngineMigrations); an operation with tables of its
// own ships its set and installs it with Migrate.
//
// Each set keeps its own sequence of versions in schema_migrations, keyed
// by (set_name, version): the engine's 0011 and an operation's 0011 are two
// migrations, and no set's next version can collide with another's. A
// version already recorded for the set under another file name is refused
// rather than skipped.
//
// A file is plain SQL: statements ended by ';', with '--' and '/* */'
// comments, quoted strings, quoted identifiers and dollar-quoted bodies.
// Migrate sends each statement on its own, outside any explicit
// transaction, so a file may not begin, commit or roll back a transaction,
// and each statement must be idempotent (CREATE ... IF NOT EXISTS, DROP ...
// IF EXISTS, ADD COLUMN IF NOT EXISTS): a file that failed midway runs
// again from its first statement (docs/migrations.md).
type Migrations struct {
	// Name names the set: its namespace in schema_migrations ("engine",
	// "payments", an operation's name). It must not be empty, and must
	// not change once the set has been applied.
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
	set        string
	version    int
	name       string // the file name, as recorded in schema_migrations
	statements []statement
}

// migrationSet is a set's files in version order.
type migrationSet struct {
	name  string
	files []migration
}

// collect reads the engine's set and sets, in that order, each set's files
// in version order, and splits every file into its statements: a file
// Migrate could not run is refused before anything runs. Two files of one
// set with one version, and two different sets of one name, are refused; a
// set given twice is taken once.
func collect(sets []Migrations) ([]migrationSet, error) {
	var all []migrationSet
	for _, set := range append([]Migrations{EngineMigrations()}, sets...) {
		if set.Name == unattributed {
			return nil, errors.New("store: a migration set needs a name (Migrations.Name)")
		}
		files, err := fs.Glob(set.FS, "*.sql")
		if err != nil {
			return nil, fmt.Errorf("store: list %s migrations: %w", set.Name, err)
		}
		ms := migrationSet{name: set.Name}
		seen := map[int]string{}
		for _, f := range files {
			version, err := strconv.Atoi(strings.SplitN(f, "_", 2)[0])
			if err != nil || version < 0 {
				return nil, fmt.Errorf("store: %s migration %s: the name must start with a version number and '_'", set.Name, f)
			}
			if other, ok := seen[version]; ok {
				return nil, fmt.Errorf("store: %s migration version %d is both %s and %s", set.Name, version, other, f)
			}
			seen[version] = f
			body, err := fs.ReadFile(set.FS, f)
			if err != nil {
				return nil, fmt.Errorf("store: read %s migration %s: %w", set.Name, f, err)
			}
			stmts, err := splitStatements(string(body))
			if err != nil {
				return nil, fmt.Errorf("store: %s migration %s: %w", set.Name, f, err)
			}
			ms.files = append(ms.files, migration{set: set.Name, version: version, name: f, statements: stmts})
		}
		sort.Slice(ms.files, func(i, j int) bool { return ms.files[i].version < ms.files[j].version })
		if i := slices.IndexFunc(all, func(o migrationSet) bool { return o.name == ms.name }); i >= 0 {
			if !sameFiles(all[i], ms) {
				return nil, fmt.Errorf("store: two different migration sets are named %s", ms.name)
			}
			continue // the same set given twice
		}
		all = append(all, ms)
	}
	return all, nil
}

func sameFiles(a, b migrationSet) bool {
	return slices.EqualFunc(a.files, b.files, func(x, y migration) bool { return x.name == y.name })
}

// The bookkeeping tables. schema_migrations has one row per applied file,
// keyed by its set and version. A row whose set_name is empty was recorded
// by a release that kept one sequence for every set (the previous layout,
// which had no set_name) and is not yet attributed to its set: the next
// Migrate given the set that has a file of that version and name
// attributes it.
//
// schema_migrations_lock holds at most one row, the migration lock: who
// holds it and until when, by the store's clock. It is a row rather than an
// advisory lock because a transaction pooler (PgBouncer in transaction
// mode) keeps no session to hold one in, and CockroachDB has none.
const (
	createSchemaMigrations = `CREATE TABLE IF NOT EXISTS schema_migrations (
		set_name   TEXT        NOT NULL DEFAULT '',
		version    INT         NOT NULL,
		name       TEXT        NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
		PRIMARY KEY (set_name, version)
	)`
	createMigrationLock = `CREATE TABLE IF NOT EXISTS schema_migrations_lock (
		name       TEXT        NOT NULL PRIMARY KEY,
		owner      TEXT        NOT NULL,
		expires_at TIMESTAMPTZ NOT NULL
	)`
	// The previous layout's upgrade, each step one statement and each
	// skipped once done: a set column whose default marks the rows already
	// there as not yet attributed, then the key (set_name, version) in
	// place of (version). Dropping and adding the primary key in one
	// ALTER TABLE is how CockroachDB changes one without leaving the old
	// key behind as a secondary index; PostgreSQL does it in one step too.
	addSetName    = `ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS set_name TEXT NOT NULL DEFAULT ''`
	keyBySetFmt   = `ALTER TABLE schema_migrations DROP CONSTRAINT %s, ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (set_name, version)`
	addKeyBySet   = `ALTER TABLE schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (set_name, version)`
	recordApplied = `INSERT INTO schema_migrations (set_name, version, name) VALUES ($1, $2, $3) ON CONFLICT (set_name, version) DO NOTHING`
)

// unattributed is the set_name of a row recorded in the previous layout.
const unattributed = ""

// migrationLockName is the lock row's key.
const migrationLockName = "migrate"

// SQLSTATE codes of the bookkeeping.
const (
	codeUndefinedTable  = "42P01"
	codeUndefinedColumn = "42703"
	codeDuplicateObject = "42710"
	codeDuplicateTable  = "42P07"
)

// Migrate applies every migration of the engine's set and of sets (an
// operation's own tables) not yet applied: the engine's set first, then
// sets in the order given, each in version order, so a set may build on
// the engine's tables and on those of the sets before it.
//
// It is safe to run from several processes at once: they take turns under
// the migration lock (a row in schema_migrations_lock, see
// migrationLockTiming), and each finds applied what the one before it
// applied. A waiter gives up at ctx's deadline, naming the holder.
//
// Each statement of a file runs on its own, as an implicit transaction,
// and the file's version is recorded only after its last statement
// succeeded. Nothing else is atomic: a file that fails midway keeps the
// effect of its statements before the failing one and is not recorded, so
// that the next Migrate runs it again from its first statement; hence its
// statements must be idempotent. (DDL in an explicit transaction is not
// atomic on CockroachDB either: since v25.1 it commits what came before it,
// and before that it ran after the commit and could fail there.)
//
// A database in the previous layout (one sequence of versions for every
// set) is upgraded in place under the lock; rows it recorded are
// attributed to the set that has a file of that version and name.
func (s *Store) Migrate(ctx context.Context, sets ...Migrations) error {
	return s.migrate(ctx, defaultMigrationLockTiming, sets)
}

func (s *Store) migrate(ctx context.Context, timing migrationLockTiming, sets []Migrations) (err error) {
	all, err := collect(sets)
	if err != nil {
		return err
	}
	if err := s.execDDL(ctx, createMigrationLock); err != nil {
		return fmt.Errorf("store: create schema_migrations_lock: %w", err)
	}
	lock, err := s.takeMigrationLock(ctx, timing)
	if err != nil {
		return err
	}
	defer lock.release()
	ctx = lock.ctx
	defer func() {
		// Once the lock is lost, whatever failed failed for that.
		if err != nil && lock.lost() {
			err = fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
	}()

	if err := s.prepareSchemaMigrations(ctx); err != nil {
		return err
	}
	rows, _, err := s.readRecorded(ctx)
	if err != nil {
		return err
	}
	plan, err := planMigrations(all, rows)
	if err != nil {
		return err
	}
	for _, r := range plan.redundant {
		if err := s.ExecOne(ctx, func(q Querier) error {
			_, err := q.Exec(ctx, `DELETE FROM schema_migrations WHERE set_name = '' AND version = $1 AND name = $2`, r.version, r.name)
			return err
		}); err != nil {
			return fmt.Errorf("store: drop the previous layout's duplicate of %s: %w", r.name, Classify(err))
		}
	}
	for _, r := range plan.attribute {
		if err := s.ExecOne(ctx, func(q Querier) error {
			_, err := q.Exec(ctx, `UPDATE schema_migrations SET set_name = $1 WHERE set_name = '' AND version = $2 AND name = $3`, r.set, r.version, r.name)
			return err
		}); err != nil {
			return fmt.Errorf("store: attribute %s to the %s set: %w", r.name, r.set, Classify(err))
		}
	}
	for _, m := range plan.pending {
		if err := s.applyMigration(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// execDDL runs one DDL statement as an implicit transaction of its own
// (no arguments: pgx sends it in the simple protocol, whatever the
// pool's query mode). Concurrent CREATE ... IF NOT EXISTS can race in
// PostgreSQL's catalog; a unique violation or "already exists" there means
// another process won, which is what was wanted.
func (s *Store) execDDL(ctx context.Context, sql string) error {
	if _, err := s.pool.Exec(ctx, sql); err != nil {
		switch sqlState(err) {
		case codeUniqueViolation, codeDuplicateObject, codeDuplicateTable:
			return nil
		}
		return Classify(err)
	}
	return nil
}

// applyMigration runs m's statements one by one, each an implicit
// transaction of its own, and then records m.
func (s *Store) applyMigration(ctx context.Context, m migration) error {
	for i, st := range m.statements {
		if _, err := s.pool.Exec(ctx, st.sql); err != nil {
			return fmt.Errorf("store: apply %s migration %s: statement %d of %d (line %d): %w (not recorded; it runs again from its first statement next time)",
				m.set, m.name, i+1, len(m.statements), st.line, Classify(err))
		}
	}
	if err := s.ExecOne(ctx, func(q Querier) error {
		_, err := q.Exec(ctx, recordApplied, m.set, m.version, m.name)
		return err
	}); err != nil {
		return fmt.Errorf("store: record %s migration %s (its statements ran; it runs again next time): %w", m.set, m.name, Classify(err))
	}
	return nil
}

// prepareSchemaMigrations creates schema_migrations, or upgrades the
// previous layout in place. It runs under the migration lock; each step
// is one statement, done only if not done yet, so an upgrade cut short
// resumes where it stopped.
func (s *Store) prepareSchemaMigrations(ctx context.Context) error {
	if err := s.execDDL(ctx, createSchemaMigrations); err != nil {
		return fmt.Errorf("store: create schema_migrations: %w", err)
	}
	layout, err := s.readSchemaMigrationsLayout(ctx)
	if err != nil {
		return err
	}
	if !layout.hasSetName {
		if err := s.execDDL(ctx, addSetName); err != nil {
			return fmt.Errorf("store: upgrade schema_migrations (add set_name): %w", err)
		}
	}
	if !slices.Equal(layout.key, []string{"set_name", "version"}) {
		ddl := addKeyBySet
		if layout.keyName != "" {
			ddl = fmt.Sprintf(keyBySetFmt, pgx.Identifier{layout.keyName}.Sanitize())
		}
		if _, err := s.pool.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("store: upgrade schema_migrations (key by set_name, version): %w", Classify(err))
		}
	}
	return nil
}

// schemaMigrationsLayout is what schema_migrations looks like.
type schemaMigrationsLayout struct {
	hasSetName bool
	keyName    string   // the primary key's constraint name ("" if none)
	key        []string // its columns in order
}

func (s *Store) readSchemaMigrationsLayout(ctx context.Context) (schemaMigrationsLayout, error) {
	var l schemaMigrationsLayout
	err := s.Read(ctx, func(q Querier) error {
		l = schemaMigrationsLayout{}
		var n int
		if err := q.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'schema_migrations' AND column_name = 'set_name'`).Scan(&n); err != nil {
			return err
		}
		l.hasSetName = n > 0
		rows, err := q.Query(ctx, `SELECT tc.constraint_name, kcu.column_name
			FROM information_schema.table_constraints tc
			JOIN information_schema.key_column_usage kcu
			  ON kcu.constraint_schema = tc.constraint_schema AND kcu.constraint_name = tc.constraint_name
			 AND kcu.table_schema = tc.table_schema AND kcu.table_name = tc.table_name
			WHERE tc.table_schema = current_schema() AND tc.table_name = 'schema_migrations' AND tc.constraint_type = 'PRIMARY KEY'
			ORDER BY kcu.ordinal_position`)
		if err != nil {
			return err
		}
		var name, column string
		_, err = pgx.ForEachRow(rows, []any{&name, &column}, func() error {
			l.keyName = name
			l.key = append(l.key, column)
			return nil
		})
		return err
	})
	if err != nil {
		return l, fmt.Errorf("store: read schema_migrations' layout: %w", Classify(err))
	}
	return l, nil
}

// recorded is one row of schema_migrations.
type recorded struct {
	set     string // unattributed: recorded in the previous layout
	version int
	name    string
}

// readRecorded reads schema_migrations in either layout (the previous
// one's rows come back unattributed). exists is false if there is no
// schema_migrations yet.
func (s *Store) readRecorded(ctx context.Context) (rows []recorded, exists bool, err error) {
	read := func(query string) error {
		return s.Read(ctx, func(q Querier) error {
			rows = rows[:0]
			r, err := q.Query(ctx, query)
			if err != nil {
				return err
			}
			var row recorded
			_, err = pgx.ForEachRow(r, []any{&row.set, &row.version, &row.name}, func() error {
				rows = append(rows, row)
				return nil
			})
			return err
		})
	}
	err = read(`SELECT set_name, version, name FROM schema_migrations`)
	if sqlState(err) == codeUndefinedColumn {
		err = read(`SELECT ''::TEXT, version, name FROM schema_migrations`)
	}
	switch {
	case sqlState(err) == codeUndefinedTable:
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("store: read schema_migrations: %w", Classify(err))
	}
	return rows, true, nil
}

// migrationPlan is what sets' files and the recorded rows make of each
// other.
type migrationPlan struct {
	pending   []migration // not applied, in the order Migrate applies them
	attribute []recorded  // unattributed rows a given set claims (set filled in)
	redundant []recorded  // unattributed rows whose set has the row already
	status    []SetStatus
}

// planMigrations compares sets' files with rows. An unattributed row is
// the set's whose file has its version and name; one whose file no given
// set has keeps its version from being applied in any set until a set
// claims it, as it kept it in the one sequence it was recorded in. A
// version recorded for its set under another name is refused.
func planMigrations(sets []migrationSet, rows []recorded) (migrationPlan, error) {
	type key struct {
		set     string
		version int
	}
	type file struct {
		version int
		name    string
	}
	var p migrationPlan
	owners := map[file][]string{}
	for _, set := range sets {
		for _, m := range set.files {
			f := file{m.version, m.name}
			owners[f] = append(owners[f], set.name)
		}
	}
	applied := map[key]string{}
	for _, r := range rows {
		if r.set != unattributed {
			applied[key{r.set, r.version}] = r.name
		}
	}
	unclaimed := map[int][]string{} // version -> names
	for _, r := range rows {
		if r.set != unattributed {
			continue
		}
		switch o := owners[file{r.version, r.name}]; len(o) {
		case 0:
			unclaimed[r.version] = append(unclaimed[r.version], r.name)
		case 1:
			k := key{o[0], r.version}
			switch got, ok := applied[k]; {
			case !ok:
				applied[k] = r.name
				p.attribute = append(p.attribute, recorded{set: o[0], version: r.version, name: r.name})
			case got == r.name:
				p.redundant = append(p.redundant, r)
			default:
				return p, fmt.Errorf("store: %s migration version %d is applied as %s, not %s", o[0], r.version, got, r.name)
			}
		default:
			return p, fmt.Errorf("store: version %d %s was recorded before sets had versions of their own, and the sets %s all have that file: attribute it by hand (UPDATE schema_migrations SET set_name = '<set>' WHERE set_name = '' AND version = %d)",
				r.version, r.name, strings.Join(o, ", "), r.version)
		}
	}
	setNames := make([]string, len(sets))
	for i, set := range sets {
		setNames[i] = set.name
	}
	for _, set := range sets {
		st := SetStatus{Name: set.name}
		versions := map[int]bool{}
		for _, m := range set.files {
			versions[m.version] = true
			got, ok := applied[key{set.name, m.version}]
			switch {
			case ok && got == m.name:
				st.Applied = append(st.Applied, m.version)
			case ok:
				return p, fmt.Errorf("store: %s migration version %d is applied as %s, not %s", set.name, m.version, got, m.name)
			case len(unclaimed[m.version]) > 0:
				return p, fmt.Errorf("store: %s migration %s: version %d was recorded as %s before sets had versions of their own, and none of the sets given (%s) has that file; migrate once with the set that has it, which attributes it to that set, then this one",
					set.name, m.name, m.version, strings.Join(unclaimed[m.version], ", "), strings.Join(setNames, ", "))
			default:
				st.Pending = append(st.Pending, m.version)
				p.pending = append(p.pending, m)
			}
		}
		for k := range applied {
			if k.set == set.name && !versions[k.version] {
				st.Unknown = append(st.Unknown, k.version)
			}
		}
		sort.Ints(st.Unknown)
		p.status = append(p.status, st)
	}
	return p, nil
}

// SetStatus is one migration set's versions as the database records them.
type SetStatus struct {
	// Name is the set's (Migrations.Name).
	Name string
	// Applied are the versions of the set's files that are recorded as
	// applied, ascending.
	Applied []int
	// Pending are the versions of the set's files not applied yet, in
	// the order Migrate applies them.
	Pending []int
	// Unknown are versions recorded for the set that none of its files
	// has (applied by a later release), ascending.
	Unknown []int
}

// MigrationStatus reports, for the engine's set and each of sets in that
// order, which of its versions are applied and which pending. It reads
// only, and reads a database still in the previous layout as Migrate would
// attribute it. It fails as CheckMigrated does on a version recorded
// under another file name.
func (s *Store) MigrationStatus(ctx context.Context, sets ...Migrations) ([]SetStatus, error) {
	all, err := collect(sets)
	if err != nil {
		return nil, err
	}
	rows, _, err := s.readRecorded(ctx)
	if err != nil {
		return nil, err
	}
	plan, err := planMigrations(all, rows)
	if err != nil {
		return nil, err
	}
	return plan.status, nil
}

// CheckMigrated returns an error, naming what is missing, unless every
// migration of the engine's set and of sets has been applied (under its
// name). A node that must not run DDL (its role may only read and write
// rows) calls it at start instead of Migrate. It reads only, and reads a
// database still in the previous layout as Migrate would attribute it.
func (s *Store) CheckMigrated(ctx context.Context, sets ...Migrations) error {
	all, err := collect(sets)
	if err != nil {
		return err
	}
	rows, exists, err := s.readRecorded(ctx)
	if err != nil {
		return err
	}
	if !exists {
		return errors.New("store: no migration has been applied (run idemctl migrate as the schema's owner)")
	}
	plan, err := planMigrations(all, rows)
	if err != nil {
		return err
	}
	if len(plan.pending) > 0 {
		var missing []string
		for _, m := range plan.pending {
			missing = append(missing, m.set+" "+m.name)
		}
		return fmt.Errorf("store: migrations not applied (run idemctl migrate as the schema's owner): %s", strings.Join(missing, ", "))
	}
	return nil
}

// migrationLockTiming is how the migration lock is held and waited for.
type migrationLockTiming struct {
	// ttl is how long the lock holds past its last refresh, by the
	// store's clock: a holder that died is taken over after it.
	ttl time.Duration
	// refresh is how often a holder pushes its expiry ttl ahead.
	refresh time.Duration
	// poll is a waiter's pause between attempts (jittered).
	poll time.Duration
}

// defaultMigrationLockTiming: a crashed migrator holds the others up for
// at most half a minute; a live one refreshes the lock three times in
// that span, so a migration may run as long as it needs to.
var defaultMigrationLockTiming = migrationLockTiming{ttl: 30 * time.Second, refresh: 10 * time.Second, poll: 200 * time.Millisecond}

// errMigrationLockLost ends a migration whose lock was taken over (it was
// not refreshed within its ttl) or could not be refreshed in time.
var errMigrationLockLost = errors.New("store: the migration lock was lost (not refreshed in time); stopped migrating")

// migrationLock is a held migration lock. ctx is the caller's, cancelled
// with errMigrationLockLost if the lock is lost.
type migrationLock struct {
	s       *Store
	owner   string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	stop    chan struct{}
	stopped chan struct{}
}

func (l *migrationLock) lost() bool { return errors.Is(context.Cause(l.ctx), errMigrationLockLost) }

// newLockOwner names a lock holder for whoever finds the lock held: the
// host and process, and a random part that tells apart two stores of one
// process.
func newLockOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), rand.Text()[:10])
}

// takeMigrationLock waits until it holds the migration lock, or ctx ends.
// The lock is a row: inserted if there is none, taken over if its expiry
// has passed by the store's clock, and kept by its holder with refreshes
// until release deletes it. Every step is one statement, so it needs no
// session and works behind a transaction pooler and on CockroachDB.
func (s *Store) takeMigrationLock(ctx context.Context, timing migrationLockTiming) (*migrationLock, error) {
	owner := newLockOwner()
	waited := false
	for {
		took, err := s.tryMigrationLock(ctx, owner, timing.ttl)
		if err == nil && took {
			break
		}
		// A commit whose outcome is unknown is tried again: if it took
		// the lock, the next attempt finds it held by this owner.
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrCommitUnknown) {
			return nil, fmt.Errorf("store: take the migration lock: %w", Classify(err))
		}
		if ctx.Err() == nil && !waited {
			waited = true
			s.logger.InfoContext(ctx, "waiting for the migration lock another process holds")
		}
		select {
		case <-ctx.Done():
		case <-time.After(timing.poll/2 + mrand.N(timing.poll)):
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("store: gave up waiting for the migration lock (%s): %w", s.describeMigrationLock(ctx), ctx.Err())
		}
	}
	lctx, cancel := context.WithCancelCause(ctx)
	l := &migrationLock{s: s, owner: owner, ctx: lctx, cancel: cancel, stop: make(chan struct{}), stopped: make(chan struct{})}
	go l.keep(timing)
	return l, nil
}

// tryMigrationLock takes the lock if nobody holds it, its holder's expiry
// has passed, or owner holds it already, in one statement.
func (s *Store) tryMigrationLock(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	var took bool
	err := s.ExecOne(ctx, func(q Querier) error {
		tag, err := q.Exec(ctx, `INSERT INTO schema_migrations_lock (name, owner, expires_at)
			VALUES ($1, $2, now() + $3::INT8 * INTERVAL '1 millisecond')
			ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
			WHERE schema_migrations_lock.expires_at < now() OR schema_migrations_lock.owner = excluded.owner`,
			migrationLockName, owner, ttl.Milliseconds())
		took = err == nil && tag.RowsAffected() == 1
		return err
	})
	return took, err
}

// describeMigrationLock says who holds the lock and for how long yet, for
// the error of a waiter that gave up.
func (s *Store) describeMigrationLock(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var (
		owner string
		left  float64
	)
	err := s.Read(ctx, func(q Querier) error {
		return q.QueryRow(ctx, `SELECT owner, EXTRACT(EPOCH FROM expires_at - now())::FLOAT8 FROM schema_migrations_lock WHERE name = $1`,
			migrationLockName).Scan(&owner, &left)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "free now"
	case err != nil:
		return fmt.Sprintf("its holder could not be read: %v", err)
	case left < 0:
		return fmt.Sprintf("held by %s, expired %.1fs ago by the store's clock", owner, -left)
	default:
		return fmt.Sprintf("held by %s for %.1fs more by the store's clock, unless refreshed", owner, left)
	}
}

// keep refreshes the lock every timing.refresh until release. If the lock
// was taken over, or no refresh succeeded for ttl, it cancels l.ctx with
// errMigrationLockLost: whatever the migration runs then stops.
func (l *migrationLock) keep(timing migrationLockTiming) {
	defer close(l.stopped)
	tick := time.NewTicker(timing.refresh)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		var held bool
		err := l.s.ExecOne(l.ctx, func(q Querier) error {
			tag, err := q.Exec(l.ctx, `UPDATE schema_migrations_lock SET expires_at = now() + $3::INT8 * INTERVAL '1 millisecond'
				WHERE name = $1 AND owner = $2`, migrationLockName, l.owner, timing.ttl.Milliseconds())
			held = err == nil && tag.RowsAffected() == 1
			return err
		})
		switch {
		case err == nil && held:
			last = time.Now()
		case err == nil:
			l.cancel(errMigrationLockLost)
			return
		case time.Since(last) >= timing.ttl:
			l.cancel(fmt.Errorf("%w: %w", errMigrationLockLost, err))
			return
		}
	}
}

// release stops the refreshes and deletes the lock row if it is still
// this holder's. If the delete fails, the lock expires by itself.
func (l *migrationLock) release() {
	close(l.stop)
	<-l.stopped
	defer l.cancel(nil)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 10*time.Second)
	defer cancel()
	err := l.s.ExecOne(ctx, func(q Querier) error {
		_, err := q.Exec(ctx, `DELETE FROM schema_migrations_lock WHERE name = $1 AND owner = $2`, migrationLockName, l.owner)
		return err
	})
	if err != nil {
		l.s.logger.WarnContext(ctx, "could not release the migration lock; it expires by itself", "owner", l.owner, "err", err)
	}
}

// statement is one statement of a migration file.
type statement struct {
	sql  string
	line int // where it starts in the file, from 1
}

// splitStatements splits a migration file into its statements: each ends
// at a ';' outside a quoted string ('...', E'...' with backslash escapes),
// a quoted identifier ("..."), a dollar-quoted body ($$...$$,
// $tag$...$tag$) and a comment (-- to the end of the line, /* */, which
// nest). Comments before a statement are dropped, those inside it kept;
// the last statement needs no ';'. A statement that begins, ends or
// otherwise controls a transaction is refused: each statement runs as a
// transaction of its own. psql's meta-commands (\i, \set) and COPY ...
// FROM stdin are not SQL and cannot be sent.
func splitStatements(body string) ([]statement, error) {
	var (
		out       []statement
		start     = -1 // offset of the current statement's first character
		startLine int
		line      = 1
	)
	end := func(i int) error {
		if start < 0 {
			return nil
		}
		st := statement{sql: strings.TrimSpace(body[start:i]), line: startLine}
		if word := firstWord(st.sql); transactionControl[word] {
			return fmt.Errorf("line %d: %s: a migration file may not control transactions (each statement runs as one of its own)", st.line, word)
		}
		out = append(out, st)
		start = -1
		return nil
	}
	for i := 0; i < len(body); {
		c := body[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && strings.HasPrefix(body[i:], "--"):
			if j := strings.IndexByte(body[i:], '\n'); j >= 0 {
				i += j // the newline is counted above
			} else {
				i = len(body)
			}
		case c == '/' && strings.HasPrefix(body[i:], "/*"):
			j, err := skipBlockComment(body, i)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			line += strings.Count(body[i:j], "\n")
			i = j
		case c == ';':
			if err := end(i); err != nil {
				return nil, err
			}
			i++
		default:
			if start < 0 {
				start, startLine = i, line
			}
			j, err := skipToken(body, i)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			line += strings.Count(body[i:j], "\n")
			i = j
		}
	}
	if err := end(len(body)); err != nil {
		return nil, err
	}
	return out, nil
}

// transactionControl are the first words of statements that begin, end or
// otherwise control a transaction.
var transactionControl = map[string]bool{
	"BEGIN": true, "START": true, "COMMIT": true, "END": true, "ROLLBACK": true,
	"ABORT": true, "SAVEPOINT": true, "RELEASE": true,
}

func firstWord(sql string) string {
	i := strings.IndexFunc(sql, func(r rune) bool { return !isIdentChar(byte(r)) || r > 0x7f })
	if i < 0 {
		i = len(sql)
	}
	return strings.ToUpper(sql[:i])
}

func isIdentChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// skipBlockComment returns the offset after the /* */ comment at i
// (PostgreSQL's nest).
func skipBlockComment(body string, i int) (int, error) {
	depth := 0
	for j := i; j < len(body); {
		switch {
		case strings.HasPrefix(body[j:], "/*"):
			depth++
			j += 2
		case strings.HasPrefix(body[j:], "*/"):
			depth--
			j += 2
			if depth == 0 {
				return j, nil
			}
		default:
			j++
		}
	}
	return 0, errors.New("unterminated /* comment")
}

// skipToken returns the offset after the token at i that is not a space or
// a comment: a quoted string or identifier, a dollar-quoted body, or one
// byte of anything else.
func skipToken(body string, i int) (int, error) {
	switch c := body[i]; {
	case c == '\'':
		// E'...' (not the end of a longer identifier) takes backslash
		// escapes; any other '...' only doubled quotes.
		escapes := i > 0 && (body[i-1] == 'E' || body[i-1] == 'e') && (i < 2 || !isIdentChar(body[i-2]))
		return skipQuoted(body, i, '\'', escapes, "string")
	case c == '"':
		return skipQuoted(body, i, '"', false, "quoted identifier")
	case c == '$' && (i == 0 || !isIdentChar(body[i-1])):
		tag, ok := dollarTag(body[i:])
		if !ok {
			return i + 1, nil // a parameter ($1) or a lone '$'
		}
		j := strings.Index(body[i+len(tag):], tag)
		if j < 0 {
			return 0, fmt.Errorf("unterminated dollar-quoted body %s", tag)
		}
		return i + len(tag) + j + len(tag), nil
	case isIdentChar(c):
		j := i
		for j < len(body) && isIdentChar(body[j]) {
			j++
		}
		return j, nil
	default:
		return i + 1, nil
	}
}

// skipQuoted returns the offset after the quoted text opening at i.
func skipQuoted(body string, i int, quote byte, escapes bool, what string) (int, error) {
	for j := i + 1; j < len(body); j++ {
		switch body[j] {
		case '\\':
			if escapes {
				j++
			}
		case quote:
			if j+1 < len(body) && body[j+1] == quote {
				j++ // a doubled quote
				continue
			}
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated %s", what)
}

// dollarTag returns the $tag$ (or $$) s starts with.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || (j > 1 && c >= '0' && c <= '9'):
		default:
			return "", false
		}
	}
	return "", false
}

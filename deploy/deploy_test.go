// Package deploy holds no code: these tests keep the deployment files in
// this directory consistent with the code they deploy. They read files
// only, except TestComposePostgresProfile, which runs the compose file's
// postgres profile with docker-compose (skipped without it or the images).
package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/store"
)

const repoRoot = ".."

// sqlTable is a CREATE TABLE statement split into its parts, each normalised
// (comments dropped, whitespace collapsed, upper case).
type sqlTable struct {
	columns     map[string]string // name -> definition
	constraints []string          // PRIMARY KEY (...), CONSTRAINT name ..., UNIQUE (...)
}

var (
	createTableRe = regexp.MustCompile(`(?i)CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)\s*\(`)
	createIndexRe = regexp.MustCompile(`(?is)CREATE\s+INDEX\s+IF\s+NOT\s+EXISTS\s+(\w+)\s+(ON\s+[^;` + "`" + `]*)`)
	lineCommentRe = regexp.MustCompile(`--[^\n]*`)
	spaceRe       = regexp.MustCompile(`\s+`)
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return lineCommentRe.ReplaceAllString(string(b), "")
}

func norm(s string) string {
	return strings.ToUpper(strings.TrimSpace(spaceRe.ReplaceAllString(s, " ")))
}

// parseTables returns the CREATE TABLE IF NOT EXISTS statements of sql.
func parseTables(t *testing.T, sql string) map[string]sqlTable {
	t.Helper()
	tables := map[string]sqlTable{}
	for _, m := range createTableRe.FindAllStringSubmatchIndex(sql, -1) {
		name := strings.ToLower(sql[m[2]:m[3]])
		body, ok := balanced(sql[m[1]:])
		if !ok {
			t.Fatalf("CREATE TABLE %s: unbalanced parentheses", name)
		}
		tab := sqlTable{columns: map[string]string{}}
		for _, item := range splitTopLevel(body) {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			up := norm(item)
			if strings.HasPrefix(up, "PRIMARY KEY") || strings.HasPrefix(up, "CONSTRAINT ") || strings.HasPrefix(up, "UNIQUE") {
				tab.constraints = append(tab.constraints, up)
				continue
			}
			col, def, _ := strings.Cut(strings.TrimSpace(spaceRe.ReplaceAllString(item, " ")), " ")
			tab.columns[strings.ToLower(col)] = norm(def)
		}
		sort.Strings(tab.constraints)
		tables[name] = tab
	}
	return tables
}

// balanced returns the text up to the parenthesis closing the one just
// before s.
func balanced(s string) (string, bool) {
	depth := 1
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return s[:i], true
			}
		}
	}
	return "", false
}

func splitTopLevel(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

func parseIndexes(sql string) map[string]string {
	idx := map[string]string{}
	for _, m := range createIndexRe.FindAllStringSubmatch(sql, -1) {
		idx[strings.ToLower(m[1])] = norm(m[2])
	}
	return idx
}

// TestCockroachSchemaMirrorsMigrations checks that deploy/cockroach/schema.sql
// has every table, column, constraint and index of the migrations it records
// as applied (idemd will not run those again), and of schema_migrations.
func TestCockroachSchemaMirrorsMigrations(t *testing.T) {
	schema := readFile(t, "deploy/cockroach/schema.sql")
	deployTables := parseTables(t, schema)
	deployIndexes := parseIndexes(schema)

	// Each migration set keeps its own sequence of versions: the engine's
	// (store/migrations) and payments' (payments/migrations).
	type setVersion struct {
		set     string
		version int
	}
	nameOf, pathOf := map[setVersion]string{}, map[setVersion]string{}
	for set, dir := range map[string]string{"engine": "store/migrations", "payments": "payments/migrations"} {
		found, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.sql"))
		if err != nil || len(found) == 0 {
			t.Fatalf("no migrations found in %s: %v", dir, err)
		}
		for _, f := range found {
			base := filepath.Base(f)
			v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
			if err != nil {
				t.Fatalf("migration %s: %v", base, err)
			}
			rel, _ := filepath.Rel(repoRoot, f)
			nameOf[setVersion{set, v}], pathOf[setVersion{set, v}] = base, filepath.ToSlash(rel)
		}
	}

	ins := regexp.MustCompile(`(?is)INSERT\s+INTO\s+schema_migrations.*?;`).FindString(schema)
	marked := regexp.MustCompile(`\(\s*'([^']+)'\s*,\s*(\d+)\s*,\s*'([^']+)'\s*\)`).FindAllStringSubmatch(ins, -1)
	if len(marked) == 0 {
		t.Fatal("schema.sql records no migration in schema_migrations (as (set_name, version, name))")
	}

	sources := []string{"store/migrate.go"} // schema_migrations itself
	for _, m := range marked {
		v, _ := strconv.Atoi(m[2])
		sv := setVersion{m[1], v}
		if nameOf[sv] != m[3] {
			t.Errorf("schema.sql records %s migration %d as %q; the set has %q", m[1], v, m[3], nameOf[sv])
			continue
		}
		sources = append(sources, pathOf[sv])
	}

	for _, src := range sources {
		text := readFile(t, src)
		for name, want := range parseTables(t, text) {
			got, ok := deployTables[name]
			if !ok {
				t.Errorf("%s: table %s is missing from deploy/cockroach/schema.sql", src, name)
				continue
			}
			for col, def := range want.columns {
				if got.columns[col] != def {
					t.Errorf("%s: %s.%s is %q in the migration but %q in schema.sql", src, name, col, def, got.columns[col])
				}
			}
			for col := range got.columns {
				if _, ok := want.columns[col]; !ok && col != "crdb_region" {
					t.Errorf("schema.sql: %s.%s is not in %s", name, col, src)
				}
			}
			if strings.Join(got.constraints, "; ") != strings.Join(want.constraints, "; ") {
				t.Errorf("%s: constraints of %s differ:\n migration: %v\n schema.sql: %v", src, name, want.constraints, got.constraints)
			}
		}
		for name, def := range parseIndexes(text) {
			if deployIndexes[name] != def {
				t.Errorf("%s: index %s is %q in the migration but %q in schema.sql", src, name, def, deployIndexes[name])
			}
		}
	}
}

// TestTTLNeverDeletesOpenRecords guards the row-level TTL expression: records
// whose outcome is still open must never get an expiration.
func TestTTLNeverDeletesOpenRecords(t *testing.T) {
	schema := readFile(t, "deploy/cockroach/schema.sql")
	m := regexp.MustCompile(`(?s)ttl_expiration_expression\s*=\s*\$\$(.*?)\$\$`).FindStringSubmatch(schema)
	if m == nil {
		t.Fatal("no ttl_expiration_expression in schema.sql")
	}
	expr := m[1]
	for _, open := range []string{"IN_PROGRESS", "UNKNOWN_REQUIRES_RECOVERY"} {
		if strings.Contains(expr, open) {
			t.Errorf("the TTL expression mentions %s: open records must never expire: %s", open, expr)
		}
	}
	if !strings.Contains(expr, "expires_at + INTERVAL") {
		t.Errorf("the TTL expression must be expires_at plus the retention: %s", expr)
	}
}

// TestDeployEnvMatchesIdemdFlags checks that every IDEM_* variable the
// compose file and the Kubernetes manifests set is a flag of idemd, or a
// variable that idemd or idemctl provider reads by name (secrets, which
// are never flags).
func TestDeployEnvMatchesIdemdFlags(t *testing.T) {
	flagRe := regexp.MustCompile(`\.(?:String|Bool|Int|Int64|Uint|Uint64|Float64|Duration|Func|BoolFunc|TextVar|Var)(?:Var)?\(([^"()\n]*)"([a-z][a-z0-9-]*)"`)
	known := map[string]bool{}
	mains, _ := filepath.Glob(filepath.Join(repoRoot, "cmd/idemd/*.go"))
	// idemd's etcd connection flags are registered by internal/etcdclient.
	etcdFlags, _ := filepath.Glob(filepath.Join(repoRoot, "internal/etcdclient/*.go"))
	mains = append(mains, etcdFlags...)
	for _, f := range mains {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagRe.FindAllStringSubmatch(string(b), -1) {
			known["IDEM_"+strings.ToUpper(strings.ReplaceAll(m[2], "-", "_"))] = true
		}
	}
	if len(known) < 10 {
		t.Fatalf("found only %d idemd flags in cmd/idemd; the pattern in this test needs updating", len(known))
	}
	byName := regexp.MustCompile(`"(IDEM_[A-Z0-9_]+)"`)
	for _, f := range append(mains, filepath.Join(repoRoot, "cmd/idemctl/provider.go")) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range byName.FindAllStringSubmatch(string(b), -1) {
			known[m[1]] = true
		}
	}
	for _, v := range []string{"IDEM_AUTH_TOKENS", "IDEM_PROVIDER_API_KEY"} {
		if !known[v] {
			t.Errorf("idemd no longer reads %s; the pattern in this test needs updating", v)
		}
	}
	var files []string
	files = append(files, filepath.Join(repoRoot, "deploy/compose/docker-compose.yml"))
	_ = filepath.WalkDir(filepath.Join(repoRoot, "deploy/kubernetes"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return nil
	})
	varRe := regexp.MustCompile(`\bIDEM_[A-Z0-9_]+\b`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range varRe.FindAllString(string(b), -1) {
			if !known[v] {
				t.Errorf("%s sets %s, which is neither an idemd flag nor a variable idemd or idemctl provider reads", f, v)
			}
		}
	}
}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// sqlStatements splits SQL text into its statements, comments dropped; it
// keeps quoted strings, quoted identifiers and $$-quoted bodies whole.
func sqlStatements(sql string) ([]string, error) {
	var (
		out []string
		b   strings.Builder
	)
	quoted := func(i int, open, close string) (int, error) {
		j := strings.Index(sql[i+len(open):], close)
		if j < 0 {
			return 0, fmt.Errorf("unterminated %s at offset %d", open, i)
		}
		end := i + len(open) + j + len(close)
		b.WriteString(sql[i:end])
		return end, nil
	}
	for i := 0; i < len(sql); {
		var err error
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(sql)
			}
		case strings.HasPrefix(sql[i:], "$$"):
			i, err = quoted(i, "$$", "$$")
		case sql[i] == '\'':
			// '' inside a string is a quote: two strings side by side.
			i, err = quoted(i, "'", "'")
		case sql[i] == '"':
			i, err = quoted(i, `"`, `"`)
		case sql[i] == ';':
			if st := strings.TrimSpace(b.String()); st != "" {
				out = append(out, st)
			}
			b.Reset()
			i++
		default:
			b.WriteByte(sql[i])
			i++
		}
		if err != nil {
			return nil, err
		}
	}
	if st := strings.TrimSpace(b.String()); st != "" {
		return nil, fmt.Errorf("statement without a final semicolon: %.60s", st)
	}
	return out, nil
}

// cockroachOnly is schema.sql on PostgreSQL: what PostgreSQL can run of it,
// and what only CockroachDB's documentation vouches for (checked here for
// form only).
type cockroachOnly struct {
	regions  []string          // the database's regions, primary first
	locality map[string]string // table -> its LOCALITY clause
	params   map[string]map[string]string
	skipped  []string // statements PostgreSQL has no form of
}

var (
	crdbRegionStmt   = regexp.MustCompile(`(?i)^ALTER DATABASE idem (SET PRIMARY REGION|ADD REGION IF NOT EXISTS) "([a-z0-9-]+)"$`)
	crdbSurvivalStmt = regexp.MustCompile(`(?i)^ALTER DATABASE idem SURVIVE (REGION|ZONE) FAILURE$`)
	crdbLocality     = regexp.MustCompile(`(?i)^LOCALITY (REGIONAL BY ROW( AS \w+)?|REGIONAL BY TABLE IN PRIMARY REGION|GLOBAL)$`)
	crdbRegionColumn = regexp.MustCompile(`(?i)(\w+)\s+crdb_internal_region\s+NOT\s+VISIBLE\s+NOT\s+NULL\s+AS\s*\(`)
	crdbTableStmt    = regexp.MustCompile(`(?is)^CREATE TABLE IF NOT EXISTS (\w+)\s*\(`)
	caseArmValue     = regexp.MustCompile(`(?i)(?:THEN|ELSE)\s+'([^']*)'`)
	// The storage parameters schema.sql may set: row-level TTL's.
	ttlParams = map[string]bool{"ttl_expiration_expression": true, "ttl_job_cron": true, "ttl_delete_batch_size": true,
		"ttl_select_batch_size": true, "ttl_delete_rate_limit": true, "ttl_select_rate_limit": true, "ttl_row_stats_poll_interval": true, "ttl_pause": true}
)

// applyCockroachSchema runs deploy/cockroach/schema.sql on a new PostgreSQL
// database, every statement PostgreSQL has a form of: its tables (the
// computed region column as a generated TEXT column, without LOCALITY and
// row-level TTL's storage parameters), indexes and migration records. The
// CockroachDB-only statements and clauses are checked for form. A statement
// of any other kind fails the test: add it here, with what vouches for it.
func applyCockroachSchema(t *testing.T) (*pgxpool.Pool, cockroachOnly) {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy/cockroach/schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	stmts, err := sqlStatements(string(raw))
	if err != nil {
		t.Fatalf("schema.sql: %v", err)
	}
	pool, err := pgxpool.New(ctx, pgtest.NewDirectDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	crdb := cockroachOnly{locality: map[string]string{}, params: map[string]map[string]string{}}
	run := func(what, sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Errorf("schema.sql: %s: %v\n%s", what, err, sql)
		}
	}
	for _, st := range stmts {
		one := spaceRe.ReplaceAllString(st, " ")
		up := strings.ToUpper(one)
		switch {
		case up == "CREATE DATABASE IF NOT EXISTS IDEM", up == "USE IDEM":
			crdb.skipped = append(crdb.skipped, one)
		case crdbRegionStmt.MatchString(one):
			crdb.regions = append(crdb.regions, crdbRegionStmt.FindStringSubmatch(one)[2])
			crdb.skipped = append(crdb.skipped, one)
		case crdbSurvivalStmt.MatchString(one):
			crdb.skipped = append(crdb.skipped, one)
		case crdbTableStmt.MatchString(st):
			m := crdbTableStmt.FindStringSubmatchIndex(st)
			name := st[m[2]:m[3]]
			body, ok := balanced(st[m[1]:])
			if !ok {
				t.Errorf("schema.sql: CREATE TABLE %s: unbalanced parentheses", name)
				continue
			}
			rest := strings.TrimSpace(st[m[1]+len(body)+1:])
			if strings.HasPrefix(strings.ToUpper(rest), "WITH") {
				open := strings.IndexByte(rest, '(')
				list, ok := balanced(rest[open+1:])
				if open < 0 || !ok {
					t.Errorf("schema.sql: %s: unbalanced WITH (...)", name)
					continue
				}
				crdb.params[name] = map[string]string{}
				for _, p := range splitTopLevel(list) {
					k, v, _ := strings.Cut(p, "=")
					k, v = strings.TrimSpace(k), strings.TrimSpace(v)
					if !ttlParams[k] || v == "" {
						t.Errorf("schema.sql: %s: storage parameter %q is not one of row-level TTL's", name, k)
					}
					crdb.params[name][k] = v
				}
				rest = strings.TrimSpace(rest[open+1+len(list)+1:])
			}
			if rest = spaceRe.ReplaceAllString(rest, " "); !crdbLocality.MatchString(rest) {
				t.Errorf("schema.sql: %s: %q is not a LOCALITY clause CockroachDB documents", name, rest)
			}
			crdb.locality[name] = rest
			if loc := crdbRegionColumn.FindStringSubmatchIndex(body); loc != nil {
				expr, _ := balanced(body[loc[1]:])
				for _, v := range caseArmValue.FindAllStringSubmatch(expr, -1) {
					if !slices.Contains(crdb.regions, v[1]) {
						t.Errorf("schema.sql: %s.%s can be %q, not a region of the database (%v)", name, body[loc[2]:loc[3]], v[1], crdb.regions)
					}
				}
				body = body[:loc[0]] + body[loc[2]:loc[3]] + " TEXT NOT NULL GENERATED ALWAYS AS (" + body[loc[1]:]
			}
			run("CREATE TABLE "+name, "CREATE TABLE IF NOT EXISTS "+name+" ("+body+")")
		case strings.HasPrefix(up, "CREATE INDEX IF NOT EXISTS "), strings.HasPrefix(up, "INSERT INTO SCHEMA_MIGRATIONS "):
			run(one, st)
		default:
			t.Errorf("schema.sql: a statement this test does not know, neither run on PostgreSQL nor checked: %.80s", one)
		}
	}
	if len(crdb.regions) == 0 {
		t.Error("schema.sql sets no region")
	}
	return pool, crdb
}

// ttlExpression is idempotency_records' row-level TTL expression.
func (c cockroachOnly) ttlExpression(t *testing.T) string {
	t.Helper()
	v := c.params["idempotency_records"]["ttl_expiration_expression"]
	if !strings.HasPrefix(v, "$$") || !strings.HasSuffix(v, "$$") {
		t.Fatalf("idempotency_records has no $$-quoted ttl_expiration_expression: %q", v)
	}
	return strings.TrimSuffix(strings.TrimPrefix(v, "$$"), "$$")
}

// TestCockroachSchemaRunsOnPostgres: deploy/cockroach/schema.sql, compared
// with the migrations as text by TestCockroachSchemaMirrorsMigrations, is
// also run: every statement PostgreSQL has a form of runs there (a broken
// one fails), the CockroachDB-only ones have the forms CockroachDB
// documents, every table is created, the computed region column names only
// regions of the database, and the TTL expression is a TIMESTAMPTZ over the
// table's columns.
func TestCockroachSchemaRunsOnPostgres(t *testing.T) {
	ctx := context.Background()
	pool, crdb := applyCockroachSchema(t)
	for name := range parseTables(t, readFile(t, "deploy/cockroach/schema.sql")) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = $1`, name).Scan(&n); err != nil || n != 1 {
			t.Errorf("table %s was not created (%d, %v)", name, n, err)
		}
		if _, ok := crdb.locality[name]; !ok {
			t.Errorf("table %s has no LOCALITY", name)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE VIEW ttl_check AS SELECT (`+crdb.ttlExpression(t)+`) AS expires FROM idempotency_records`); err != nil {
		t.Fatalf("the TTL expression does not run on the table: %v", err)
	}
	var typ string
	if err := pool.QueryRow(ctx, `SELECT atttypid::regtype::text FROM pg_attribute WHERE attrelid = 'ttl_check'::regclass AND attname = 'expires'`).Scan(&typ); err != nil || typ != "timestamp with time zone" {
		t.Errorf("the TTL expression is %q (%v), want a TIMESTAMPTZ", typ, err)
	}
	var region string
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records (tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint, home_region, expires_at)
		VALUES ('t', 'o', 'k', 'h', 1, 'IN_PROGRESS', 'RECEIVED', 'us-east', now())`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT crdb_region FROM idempotency_records`).Scan(&region); err != nil || region != "us-east" {
		t.Errorf("crdb_region of a record claimed in us-east = %q, %v", region, err)
	}
}

// ttlRetention finds the metadata retention in the TTL expression:
// expires_at + INTERVAL 'N hours'.
var ttlRetention = regexp.MustCompile(`expires_at \+ INTERVAL '(\d+) hours'`)

// TestTTLDeletesWhatCleanupDeletes: the row-level TTL deletes exactly the
// records the node's cleanup deletes (store.PruneBodies, then
// store.DeleteExpired at the metadata retention the expression names),
// whatever the body retention: it never deletes a record that still keeps
// its answer, which the body retention is for, and once the node has
// pruned a record it deletes it when the node would. Checked by running the
// expression on PostgreSQL over records in every status, with and without
// an answer, created and expiring at many ages.
func TestTTLDeletesWhatCleanupDeletes(t *testing.T) {
	ctx := context.Background()
	pool, crdb := applyCockroachSchema(t)
	expr := crdb.ttlExpression(t)
	m := ttlRetention.FindStringSubmatch(spaceRe.ReplaceAllString(expr, " "))
	if m == nil {
		t.Fatalf("the TTL expression does not read expires_at + INTERVAL 'N hours' (the metadata retention, in hours: days depend on the time zone): %s", expr)
	}
	hours, _ := strconv.Atoi(m[1])
	metadata := time.Duration(hours) * time.Hour
	if metadata != 168*time.Hour {
		t.Errorf("the TTL's metadata retention is %v; idemd's --metadata-retention defaults to 168h", metadata)
	}
	expiring := func() map[string]bool {
		t.Helper()
		return keys(t, pool, `SELECT idempotency_key FROM idempotency_records WHERE (`+expr+`) <= now()`)
	}
	for _, body := range []time.Duration{time.Hour, 720 * time.Hour} {
		if _, err := pool.Exec(ctx, `TRUNCATE idempotency_records`); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, status := range []string{"COMPLETED", "FAILED_REPLAYABLE", "FAILED_RETRYABLE", "EXPIRED", "IN_PROGRESS", "UNKNOWN_REQUIRES_RECOVERY"} {
			for _, answer := range []bool{true, false} {
				if status == "EXPIRED" && answer {
					continue // PruneBodies drops the answer as it marks a record EXPIRED
				}
				for _, ageH := range []int{1, 30, 100, 200, 400, 800} {
					for _, windowH := range []int{1, 24, 100} {
						n++
						var respBody, respHeaders any
						if answer {
							respBody, respHeaders = []byte(`{"id":"tr_1"}`), `{"Content-Type":"application/json"}`
						}
						key := fmt.Sprintf("%s/answer=%v/age=%dh/window=%dh", status, answer, ageH, windowH)
						// Seven minutes off the hour: no record sits on a boundary.
						created := time.Duration(ageH)*time.Hour + 7*time.Minute
						if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records (tenant_id, operation_name, idempotency_key, request_hash,
								hash_version, status, checkpoint, response_status, response_headers, response_body, created_at, updated_at, expires_at)
							VALUES ('t', 'o', $1, 'h', 1, $2, 'COMPLETED', 201, $3::JSONB, $4::BYTEA,
								now() - $5::INT8 * INTERVAL '1 millisecond', now(), now() - $5::INT8 * INTERVAL '1 millisecond' + $6::INT8 * INTERVAL '1 millisecond')`,
							key, status, respHeaders, respBody, created.Milliseconds(), (time.Duration(windowH) * time.Hour).Milliseconds()); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		all := keys(t, pool, `SELECT idempotency_key FROM idempotency_records`)
		before := expiring()
		for {
			pruned, err := store.PruneBodies(ctx, pool, body, 10000)
			if err != nil {
				t.Fatal(err)
			}
			if pruned < 10000 {
				break
			}
		}
		after := expiring()
		if _, err := store.DeleteExpired(ctx, pool, metadata, 10000); err != nil {
			t.Fatal(err)
		}
		remaining := keys(t, pool, `SELECT idempotency_key FROM idempotency_records`)
		for k := range before {
			if !after[k] {
				t.Errorf("body retention %v: %s expired before the node's pruning, not after it", body, k)
			}
		}
		for k := range all {
			switch {
			case after[k] && remaining[k]:
				t.Errorf("body retention %v: the TTL deletes %s, which the node's cleanup keeps", body, k)
			case !after[k] && !remaining[k]:
				t.Errorf("body retention %v: the node's cleanup deletes %s, which the TTL keeps", body, k)
			}
		}
		if len(all) != n || len(after) == 0 || len(remaining) == len(all) || len(after) == len(all) {
			t.Errorf("body retention %v: %d records, the TTL expires %d and the node deletes %d: the records test nothing",
				body, len(all), len(after), len(all)-len(remaining))
		}
	}
}

// keys returns the first column of query's rows as a set.
func keys(t *testing.T, pool *pgxpool.Pool, query string) map[string]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	set, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, k := range set {
		out[k] = true
	}
	return out
}

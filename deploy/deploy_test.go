// Package deploy holds no code: these tests keep the deployment files in
// this directory consistent with the code they deploy. They read files
// only, except TestComposePostgresProfile, which runs the compose file's
// postgres profile with docker-compose (skipped without it or the images).
package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
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

	// The engine's migrations and the payments domain's share one
	// sequence of versions.
	var files []string
	for _, dir := range []string{"store/migrations", "payments/migrations"} {
		found, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.sql"))
		if err != nil || len(found) == 0 {
			t.Fatalf("no migrations found in %s: %v", dir, err)
		}
		files = append(files, found...)
	}
	byVersion := map[int]string{}
	pathOf := map[int]string{}
	for _, f := range files {
		base := filepath.Base(f)
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			t.Fatalf("migration %s: %v", base, err)
		}
		byVersion[v] = base
		rel, _ := filepath.Rel(repoRoot, f)
		pathOf[v] = filepath.ToSlash(rel)
	}

	ins := regexp.MustCompile(`(?is)INSERT\s+INTO\s+schema_migrations.*?;`).FindString(schema)
	marked := regexp.MustCompile(`\(\s*(\d+)\s*,\s*'([^']+)'\s*\)`).FindAllStringSubmatch(ins, -1)
	if len(marked) == 0 {
		t.Fatal("schema.sql records no migration in schema_migrations")
	}

	sources := []string{"store/migrate.go"} // schema_migrations itself
	for _, m := range marked {
		v, _ := strconv.Atoi(m[1])
		if byVersion[v] != m[2] {
			t.Errorf("schema.sql records migration %d as %q; the migrations have %q", v, m[2], byVersion[v])
			continue
		}
		sources = append(sources, pathOf[v])
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
	m := regexp.MustCompile(`ttl_expiration_expression\s*=\s*\$\$(.*?)\$\$`).FindStringSubmatch(schema)
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

package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/sidecar"
	"github.com/idemcoord/idem/store"
)

// runbookBase is where every alert's runbook_url points, followed by "#"
// and the alert's name in lower case: docs/runbooks.md on the project's
// main branch, beside the error codes' documentation (idemhttp's
// DefaultTypeBase).
const runbookBase = "https://github.com/idemcoord/idem/blob/main/docs/runbooks.md"

const (
	alertsFile     = "deploy/monitoring/alerts.yaml"
	alertsTestFile = "deploy/monitoring/alerts_test.yaml"
	operatorFile   = "deploy/kubernetes/components/monitoring/prometheusrule.yaml"
	runbooksFile   = "docs/runbooks.md"
)

// alertRule is one rule of a Prometheus rules file.
type alertRule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ruleGroup is a group of a Prometheus rules file.
type ruleGroup struct {
	Name  string      `json:"name"`
	Rules []alertRule `json:"rules"`
}

// ruleFile is a Prometheus rules file (and a PrometheusRule's spec).
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

func (f ruleFile) alerts() []alertRule {
	var out []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// readRuleFiles returns the rules of alerts.yaml and the PrometheusRule's
// spec, keyed by their file.
func readRuleFiles(t *testing.T) map[string]ruleFile {
	t.Helper()
	var plain ruleFile
	if err := yaml.UnmarshalStrict(readRaw(t, alertsFile), &plain); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var operator struct {
		Spec ruleFile `json:"spec"`
	}
	if err := yaml.Unmarshal(readRaw(t, operatorFile), &operator); err != nil {
		t.Fatalf("%s: %v", operatorFile, err)
	}
	if len(plain.alerts()) == 0 || len(operator.Spec.alerts()) == 0 {
		t.Fatalf("%s or %s holds no alert", alertsFile, operatorFile)
	}
	return map[string]ruleFile{alertsFile: plain, operatorFile: operator.Spec}
}

func readRaw(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mdSection is a heading of a Markdown file and the text up to the next
// heading of the same or a higher level.
type mdSection struct {
	level   int
	heading string
	body    string
}

// mdBlock is a fenced code block of a Markdown file.
type mdBlock struct {
	lang, text string
}

// parseMarkdown returns a Markdown file's headings (outside fenced code
// blocks) with their sections, and its fenced code blocks.
func parseMarkdown(text string) ([]mdSection, []mdBlock) {
	var (
		sections []mdSection
		blocks   []mdBlock
		fence    *mdBlock
		open     []int // indexes into sections whose body is still growing
	)
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence != nil && strings.HasPrefix(trimmed, "```"):
			blocks = append(blocks, *fence)
			fence = nil
		case fence != nil:
			fence.text += line + "\n"
		case strings.HasPrefix(trimmed, "```"):
			fence = &mdBlock{lang: strings.TrimPrefix(trimmed, "```")}
		default:
			if level := len(line) - len(strings.TrimLeft(line, "#")); level > 0 && level <= 6 && strings.HasPrefix(line[level:], " ") {
				for len(open) > 0 && sections[open[len(open)-1]].level >= level {
					open = open[:len(open)-1]
				}
				sections = append(sections, mdSection{level: level, heading: strings.TrimSpace(line[level:])})
				open = append(open, len(sections)-1)
				continue
			}
		}
		for _, i := range open {
			sections[i].body += line + "\n"
		}
	}
	return sections, blocks
}

var slugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped, spaces as hyphens.
func slug(heading string) string {
	return strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")
}

func normSpace(s string) string { return strings.Join(strings.Fields(s), " ") }

// runbookParts are the parts every runbook section has, in this order.
var runbookParts = []string{"**Rule.**", "**What it means.**", "**Confirm.**", "**What to do.**", "**Escalate.**"}

// TestAlertsHaveRunbooks keeps alerts and runbooks one to one: every alert
// of both rule files has a runbook_url to the section of docs/runbooks.md
// headed by its name, every section of docs/runbooks.md is headed by the
// name of an alert, and each section quotes its alert's rule (expression,
// `for` and severity), so that a changed threshold cannot leave its
// runbook describing the old one.
func TestAlertsHaveRunbooks(t *testing.T) {
	if got, want := strings.TrimSuffix(idemhttp.DefaultTypeBase, "errors.md#"), strings.TrimSuffix(runbookBase, "runbooks.md"); got != want {
		t.Errorf("runbooks live under %s, the error codes' documentation under %s", want, got)
	}
	files := readRuleFiles(t)
	plain := files[alertsFile].alerts()

	sectionList, _ := parseMarkdown(string(readRaw(t, runbooksFile)))
	sections := map[string]mdSection{} // by anchor
	for _, s := range sectionList {
		if s.level != 2 {
			continue
		}
		if _, dup := sections[slug(s.heading)]; dup {
			t.Errorf("%s: two sections are headed %q", runbooksFile, s.heading)
		}
		sections[slug(s.heading)] = s
		if !slices.ContainsFunc(plain, func(r alertRule) bool { return r.Alert == s.heading }) {
			t.Errorf("%s: section %q names no alert of %s", runbooksFile, s.heading, alertsFile)
		}
	}

	for _, path := range []string{alertsFile, operatorFile} {
		seen := map[string]bool{}
		for _, r := range files[path].alerts() {
			if seen[r.Alert] {
				t.Errorf("%s: two alerts are named %s", path, r.Alert)
			}
			seen[r.Alert] = true
			url := r.Annotations["runbook_url"]
			base, anchor, ok := strings.Cut(url, "#")
			switch {
			case url == "":
				t.Errorf("%s: alert %s has no runbook_url annotation", path, r.Alert)
				continue
			case !ok || base != runbookBase:
				t.Errorf("%s: alert %s: runbook_url %q is not %s#<section>", path, r.Alert, url, runbookBase)
				continue
			case anchor != slug(r.Alert):
				t.Errorf("%s: alert %s: runbook_url's anchor is %q, want %q (its name in lower case)", path, r.Alert, anchor, slug(r.Alert))
			}
			s, ok := sections[anchor]
			if !ok {
				t.Errorf("%s: alert %s: runbook_url %q: %s has no section #%s", path, r.Alert, url, runbooksFile, anchor)
				continue
			}
			if s.heading != r.Alert {
				t.Errorf("%s: alert %s: its section is headed %q", path, r.Alert, s.heading)
			}
			if path != alertsFile {
				continue // the PrometheusRule's rules equal alerts.yaml's (region/monitoring_test.go)
			}
			checkRunbookSection(t, r, s.body)
		}
	}
}

// checkRunbookSection checks that the runbook section body has every part
// (runbookParts, in order) and quotes r's rule.
func checkRunbookSection(t *testing.T, r alertRule, body string) {
	t.Helper()
	at := 0
	for _, part := range runbookParts {
		i := strings.Index(body[at:], part)
		if i < 0 {
			t.Errorf("%s: section %s has no %s, or not in this order: %s", runbooksFile, r.Alert, part, strings.Join(runbookParts, " "))
			continue
		}
		at += i + len(part)
	}
	rule, _, _ := strings.Cut(body, "**What it means.**")
	rule = normSpace(rule)
	when := "at once;"
	if r.For != "" {
		when = "for " + r.For + ";"
	}
	for _, want := range []string{"`" + normSpace(r.Expr) + "`", when, "`severity: " + r.Labels["severity"] + "`"} {
		if !strings.Contains(rule, want) {
			t.Errorf("%s: section %s's rule does not say %s: %s", runbooksFile, r.Alert, want, rule)
		}
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]*)\)`)

// TestRunbookLinks: every relative link of docs/runbooks.md leads to a file
// of the repository, and every anchor to a heading of its file.
func TestRunbookLinks(t *testing.T) {
	headings := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := headings[path]; ok {
			return a
		}
		a := map[string]bool{}
		secs, _ := parseMarkdown(string(readRaw(t, path)))
		for _, s := range secs {
			a[slug(s.heading)] = true
		}
		headings[path] = a
		return a
	}
	_, blocks := parseMarkdown(string(readRaw(t, runbooksFile)))
	text := string(readRaw(t, runbooksFile))
	for _, b := range blocks {
		text = strings.Replace(text, b.text, "", 1)
	}
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.Contains(target, "://") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		path := runbooksFile
		if file != "" {
			path = filepath.ToSlash(filepath.Join(filepath.Dir(runbooksFile), file))
			if _, err := os.Stat(filepath.Join(repoRoot, path)); err != nil {
				t.Errorf("%s: link %s: %v", runbooksFile, target, err)
				continue
			}
		}
		if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(path)[anchor] {
			t.Errorf("%s: link %s: %s has no heading #%s", runbooksFile, target, path, anchor)
		}
	}
}

// TestAlertRulesPromtool runs Prometheus's own promtool over the rules:
// `check rules` on both rule files (expressions, templates of the
// annotations) and on every PromQL line of docs/runbooks.md, and `test
// rules` on alerts_test.yaml, which must make every alert fire.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip(`promtool is not installed (Debian package "prometheus")`)
	}
	run := func(dir string, args ...string) bool {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			return false
		}
		return true
	}
	tmp := t.TempDir()
	writeRules := func(name string, f any) string {
		t.Helper()
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if b, err = yaml.JSONToYAML(b); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(tmp, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	files := readRuleFiles(t)
	monitoring := filepath.Join(repoRoot, filepath.Dir(alertsFile))
	run(monitoring, "check", "rules", filepath.Base(alertsFile))
	run(tmp, "check", "rules", writeRules("prometheusrule-spec.yaml", files[operatorFile]))

	// Every PromQL line of the runbooks, as a recording rule.
	queries := ruleFile{Groups: []ruleGroup{{Name: "runbooks"}}}
	_, blocks := parseMarkdown(string(readRaw(t, runbooksFile)))
	for _, b := range blocks {
		if b.lang != "promql" {
			continue
		}
		for _, line := range strings.Split(b.text, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				queries.Groups[0].Rules = append(queries.Groups[0].Rules, alertRule{
					Record: fmt.Sprintf("runbook:query_%d", len(queries.Groups[0].Rules)+1), Expr: line})
			}
		}
	}
	if len(queries.Groups[0].Rules) == 0 {
		t.Errorf("%s has no promql block", runbooksFile)
	} else if !run(tmp, "check", "rules", writeRules("runbook-queries.yaml", queries)) {
		for _, q := range queries.Groups[0].Rules {
			t.Logf("%s: %s", q.Record, q.Expr)
		}
	}

	run(monitoring, "test", "rules", filepath.Base(alertsTestFile))
	var unit struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(readRaw(t, alertsTestFile), &unit); err != nil {
		t.Fatalf("%s: %v", alertsTestFile, err)
	}
	fires := map[string]bool{}
	for _, tc := range unit.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, r := range files[alertsFile].alerts() {
		if !fires[r.Alert] {
			t.Errorf("%s: no test makes %s fire", alertsTestFile, r.Alert)
		}
	}
}

// TestRunbookSQL runs every SQL block of docs/runbooks.md, read-only, on a
// PostgreSQL with the node's migrations (the engine's and payments'), and
// checks what two of them compute: the record of a log line's key_hash
// (telemetry.KeyHash), and the key a sidecar route's upstream receives
// (sidecar.DerivedKey).
func TestRunbookSQL(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	const tenant, operation, key, generation = "T", "OP", "K", 3
	if _, err := st.Pool().Exec(ctx, `INSERT INTO idempotency_records (tenant_id, operation_name, idempotency_key,
			request_hash, hash_version, status, checkpoint, generation, created_at, expires_at)
		VALUES ($1, $2, $3, 'v2:h', 2, 'UNKNOWN_REQUIRES_RECOVERY', 'STARTED', $4, now() - INTERVAL '1 hour', now() + INTERVAL '1 day')`,
		tenant, operation, key, generation); err != nil {
		t.Fatal(err)
	}
	_, blocks := parseMarkdown(string(readRaw(t, runbooksFile)))
	var n, keyHashQueries, derivedKeyQueries int
	for _, b := range blocks {
		if b.lang != "sql" {
			continue
		}
		n++
		query := b.text
		byKeyHash := strings.Contains(query, "'KEY_HASH'")
		if byKeyHash {
			keyHashQueries++
			query = strings.ReplaceAll(query, "'KEY_HASH'", "'"+telemetry.KeyHash(key)+"'")
		}
		rows := readOnlyQuery(t, st, query)
		if byKeyHash && len(rows) != 1 {
			t.Errorf("%s: the query by key_hash finds %d records, want 1:\n%s", runbooksFile, len(rows), b.text)
		}
		for _, row := range rows {
			if v, ok := row["derived_key"]; ok {
				derivedKeyQueries++
				if want := sidecar.DerivedKey(tenant, operation, key, generation); v != want {
					t.Errorf("%s: derived_key is %v, sidecar.DerivedKey %s:\n%s", runbooksFile, v, want, b.text)
				}
			}
		}
	}
	if n == 0 || keyHashQueries == 0 || derivedKeyQueries == 0 {
		t.Errorf("%s: %d sql blocks, %d by key_hash, %d rows with a derived_key; want some of each", runbooksFile, n, keyHashQueries, derivedKeyQueries)
	}
}

// readOnlyQuery runs query in a read-only transaction and returns its rows
// by column name.
func readOnlyQuery(t *testing.T, st *store.Store, query string) []map[string]any {
	t.Helper()
	ctx := t.Context()
	tx, err := st.Pool().BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, query)
	if err != nil {
		t.Errorf("%s: %v\n%s", runbooksFile, err, query)
		return nil
	}
	var out []map[string]any
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Errorf("%s: %v\n%s", runbooksFile, err, query)
			return nil
		}
		row := map[string]any{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name] = vals[i]
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Errorf("%s: %v\n%s", runbooksFile, err, query)
	}
	return out
}

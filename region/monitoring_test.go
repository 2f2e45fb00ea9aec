package region_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/telemetry/collectors"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
)

// ruleGroups is a Prometheus rules file (and a PrometheusRule's spec).
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

var (
	promString  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promBraces  = regexp.MustCompile(`\{[^{}]*\}`)
	promRange   = regexp.MustCompile(`\[[^\]]*\]`)
	promGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promVar     = regexp.MustCompile(`\$\w+`)
	promNumber  = regexp.MustCompile(`(^|[^\w:])\d+(?:\.\d+)?(?:e[-+]?\d+)?`)
	promIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeyword = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true}
)

// metricNames returns the metric names a PromQL expression reads: its
// identifiers, once label matchers, ranges, grouping clauses, strings,
// numbers, dashboard variables and function names are set aside.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, " ")
	e = promBraces.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGroup.ReplaceAllString(e, " ")
	e = promVar.ReplaceAllString(e, " ")
	e = promNumber.ReplaceAllString(e, "${1} ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		if m[1] != "" || promKeyword[m[0]] {
			continue // a function call, or a keyword
		}
		names = append(names, m[0])
	}
	return names
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, outcome) (rate(a_bucket{code=~"5..", x="y{z}"}[5m]))) / clamp_min(sum(b_total[$__rate_interval]), 1e-9) > 0.05 or on (instance) c:rec`)
	if want := []string{"a_bucket", "b_total", "c:rec"}; !reflect.DeepEqual(got, want) {
		t.Errorf("metricNames = %q, want %q", got, want)
	}
}

// scrapeNames returns the metric names of a node's /metrics.
func scrapeNames(t *testing.T, url string, into map[string]bool) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		into[promIdent.FindString(line)] = true
	}
}

// TestMonitoringNamesRealMetrics: every metric an alert rule
// (deploy/monitoring/alerts.yaml, and the same rules in the Prometheus
// Operator's PrometheusRule) or a dashboard panel reads is in the /metrics
// of real nodes (two regions, a forwarded request, the workers' metrics
// and the etcd client's), so that a renamed metric or a typo cannot leave
// an alert silently reading nothing.
func TestMonitoringNamesRealMetrics(t *testing.T) {
	var rules, operator struct {
		ruleGroups
		Spec ruleGroups `json:"spec"`
	}
	readYAML(t, "../deploy/monitoring/alerts.yaml", &rules)
	var crd map[string]any
	readYAML(t, "../deploy/kubernetes/components/monitoring/prometheusrule.yaml", &crd)
	spec, _ := json.Marshal(crd["spec"])
	if err := json.Unmarshal(spec, &operator.Spec); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rules.ruleGroups, operator.Spec) {
		t.Errorf("deploy/monitoring/alerts.yaml and the PrometheusRule differ:\n%+v\n%+v", rules.ruleGroups, operator.Spec)
	}
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %+v lacks a name, expression, severity or summary", r)
			}
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	for _, want := range []string{"idempotency_conflict_different_request_total", "idempotency_in_progress_age_max_seconds",
		"idempotency_unknown_state_total", "idempotency_expired_retry_total", "idempotency_provider_key_conflicts_total"} {
		if !strings.Contains(strings.Join(mapValues(exprs), "\n"), want) {
			t.Errorf("no alert reads %s", want)
		}
	}
	b, err := os.ReadFile("../deploy/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs["panel "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && strings.HasPrefix(q, "label_values(") {
			exprs["variable "+v.Name] = strings.SplitN(strings.TrimPrefix(q, "label_values("), ",", 2)[0]
		}
	}

	// Real nodes: a forward from us-east to eu-west (forward metrics), the
	// workers, payments (outbox metrics), an etcd client's calls (gRPC
	// metrics) and a sidecar route (its upstream calls' metrics).
	c := newFwdCluster(t, false)
	secret := []byte("s3cret-peer")
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@http://127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	eu := c.start("eu-west", region.Config{PeerSecret: secret, Registry: regs[0], Sidecar: region.SidecarConfig{Routes: routes}})
	us := c.start("us-east", region.Config{PeerSecret: secret, Registry: regs[1]})
	for _, n := range []*fwdNode{eu, us} {
		n.srv.StartWorkers(t.Context(), region.WorkerConfig{RecoveryInterval: 1 << 62, CleanupInterval: 1 << 62})
	}
	if a := c.send(us.url, "monitoring", nil); a.status != http.StatusCreated {
		t.Fatalf("forwarded payment: %d %s", a.status, a.body)
	}
	dial, err := collectors.EtcdClientMetrics(regs[0])
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.etcd.Config()
	cfg.DialOptions = append(cfg.DialOptions, dial...)
	if _, err := etcdtest.NewClient(t, cfg).Get(t.Context(), "monitoring"); err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	scrapeNames(t, eu.url, have)
	scrapeNames(t, us.url, have)

	keys := mapKeys(exprs)
	for _, k := range keys {
		names := metricNames(exprs[k])
		if len(names) == 0 {
			t.Errorf("%s reads no metric: %s", k, exprs[k])
		}
		for _, n := range names {
			if !have[n] {
				t.Errorf("%s reads %s, which no node exposes: %s", k, n, exprs[k])
			}
		}
	}
}

func mapKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func mapValues(m map[string]string) []string {
	var vs []string
	for _, k := range mapKeys(m) {
		vs = append(vs, m[k])
	}
	return vs
}

package region_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// series scrapes /metrics and returns its sample lines, by metric line.
func (n *node) series() map[string]bool {
	n.t.Helper()
	a := n.do(http.MethodGet, "/metrics", "", nil, "")
	if a.status != http.StatusOK {
		n.t.Fatalf("GET /metrics = %d", a.status)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(a.body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		out[name] = true
	}
	return out
}

// TestMetricCardinalityBounded: floods of coordination begins for distinct
// undeclared operations (with valid and invalid bodies, authenticated or
// not), of distinct unknown paths and of unknown methods add no series to
// /metrics, and store nothing. Undeclared operations answer 404
// OPERATION_UNKNOWN without echoing the name.
func TestMetricCardinalityBounded(t *testing.T) {
	n := newNode(t)
	hash := `{"requestHash":"v1:abc"}`
	// One of each kind first: a route pattern's series may appear once.
	n.begin("tok-a", "op", "warm-1", hash)
	n.begin("tok-a", "op", "warm-2", `{"bad":1}`)
	n.begin("", "op", "warm-3", hash)
	n.begin("tok-a", "undeclared", "warm-4", hash)
	n.do(http.MethodGet, "/nowhere", "", nil, "")
	n.do("PATCH", "/payments", "tok-a", nil, "")
	n.do("BREW", "/nowhere", "", nil, "")
	n.do(http.MethodGet, "/v1/coordination/op/warm-1", "tok-a", nil, "")
	n.do(http.MethodGet, "/v1/coordination/undeclared/warm-1", "tok-a", nil, "")
	n.do(http.MethodGet, "/flood/x/../x", "", nil, "")
	n.do(http.MethodGet, "//double/x", "", nil, "")
	n.do(http.MethodGet, "/payments/x", "tok-a", nil, "")
	n.do(http.MethodGet, "/v1/idempotency/records/op/k", "tok-a", nil, "")
	records := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`)
	before := n.series()

	for i := range 300 {
		op := fmt.Sprintf("flood_op_%d", i)
		a, _ := n.begin("tok-a", op, "k", hash)
		expectError(t, "begin of an undeclared operation", a, http.StatusNotFound, idem.ECodeOperationUnknown)
		if strings.Contains(string(a.body), op) {
			t.Fatalf("answer echoes the operation name: %s", a.body)
		}
		n.begin("tok-a", op, "k", `{"bad":1}`)
		n.begin("", op, "k", hash)
		n.coord(http.MethodGet, "tok-a", op, "k", "", "")
		n.coord(http.MethodPost, "tok-a", op, "k", "complete", `{"fencingToken":1}`)
		n.do(http.MethodGet, fmt.Sprintf("/flood/%d", i), "", nil, "")
		n.do(fmt.Sprintf("BREW%d", i), "/payments", "tok-a", nil, "")
		n.do(fmt.Sprintf("BREW%d", i), fmt.Sprintf("/x/%d", i), "", nil, "")
		n.do(http.MethodGet, fmt.Sprintf("/flood/%d/../x", i), "", nil, "")
		n.do(http.MethodGet, fmt.Sprintf("//double/%d", i), "", nil, "")
		n.do(http.MethodGet, fmt.Sprintf("/payments/%d", i), "tok-a", nil, "")
		n.do(http.MethodGet, fmt.Sprintf("/v1/idempotency/records/%s/k", op), "tok-a", nil, "")
	}

	after := n.series()
	var added []string
	for s := range after {
		if !before[s] {
			added = append(added, s)
		}
	}
	if len(added) > 0 {
		t.Errorf("the flood added %d series (of %d before), e.g. %.5q", len(added), len(before), added)
	}
	if got := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); got != records {
		t.Errorf("%d records after the flood, want %d", got, records)
	}
}

// TestMetricsExistAtZero: a fresh node exposes every documented labelled
// series of the operations it serves at 0, so that an alert on a rate reads
// 0 rather than "no data".
func TestMetricsExistAtZero(t *testing.T) {
	n := newNode(t)
	got := n.series()
	var want []string
	for _, op := range append([]string{"create_payment"}, testOperations...) {
		for _, outcome := range []string{"execute", "replay", "conflict", "in_progress", "recover", "expired", "rejected", "error"} {
			want = append(want, fmt.Sprintf(`idempotency_requests_total{operation=%q,outcome=%q}`, op, outcome))
		}
		for _, name := range []string{"idempotency_replay_total", "idempotency_conflict_different_request_total",
			"idempotency_in_progress_answers_total", "idempotency_expired_retry_total", "idempotency_unknown_state_total"} {
			want = append(want, fmt.Sprintf(`%s{operation=%q}`, name, op))
		}
	}
	for _, outcome := range []string{"completed", "released", "declined", "unknown", "skipped", "conflict"} {
		want = append(want, fmt.Sprintf(`idempotency_recovery_total{outcome=%q}`, outcome))
	}
	for _, w := range []string{"recovery", "cleanup", "outbox-publish", "outbox-ledger", "outbox-receipt-email", "outbox-send"} {
		want = append(want, fmt.Sprintf(`idempotency_worker_errors_total{worker=%q}`, w))
	}
	want = append(want, "idempotency_provider_key_conflicts_total", "idempotency_fenced_total", "idempotency_claim_taken_share")
	for _, kind := range []string{"claim", "operation_claim", "checkpoint", "completion"} {
		want = append(want, fmt.Sprintf(`idempotency_store_group_batches_total{kind=%q}`, kind))
		for _, st := range []string{"own", "batch"} {
			want = append(want, fmt.Sprintf(`idempotency_store_group_writes_total{kind=%q,statement=%q}`, kind, st))
		}
	}
	body := string(n.do(http.MethodGet, "/metrics", "", nil, "").body)
	for _, s := range want {
		if !got[s] {
			t.Errorf("fresh node has no series %s", s)
		} else if !strings.Contains(body, s+" 0\n") {
			t.Errorf("fresh node's %s is not 0", s)
		}
	}
}

// TestMetricsCountGroupCommits: a payment's claim, sent alone (nothing
// else in flight), counts as an operation claim in a statement of its own.
func TestMetricsCountGroupCommits(t *testing.T) {
	n := newNode(t)
	if a := n.do(http.MethodPost, "/payments", "tok-a", map[string]string{"Idempotency-Key": "group-1"}, article); a.status != http.StatusCreated {
		t.Fatalf("payment = %d %s", a.status, a.body)
	}
	body := string(n.do(http.MethodGet, "/metrics", "", nil, "").body)
	for _, s := range []string{`idempotency_store_group_writes_total{kind="operation_claim",statement="own"} 1`,
		`idempotency_store_group_writes_total{kind="operation_claim",statement="batch"} 0`,
		`idempotency_store_group_batches_total{kind="operation_claim"} 0`} {
		if !strings.Contains(body, s+"\n") {
			t.Errorf("after one payment, /metrics lacks %s", s)
		}
	}
}

// TestMetricsToken: with MetricsToken set, /metrics answers only the bearer
// of that token; a tenant's token or none gets 401 UNAUTHENTICATED with no
// series in the body.
func TestMetricsToken(t *testing.T) {
	st, _ := storetest.New(t)
	n := startNode(t, st, payments.NewService(st, payments.Config{Region: "test"}), region.Config{MetricsToken: "scrape-secret"})
	for _, tc := range []struct{ name, token string }{{"no token", ""}, {"a tenant's token", "tok-a"}, {"a wrong token", "scrape-secret2"}} {
		a := n.do(http.MethodGet, "/metrics", tc.token, nil, "")
		if a.status != http.StatusUnauthorized || a.code() != idem.ECodeUnauthenticated || strings.Contains(string(a.body), "idempotency_") {
			t.Errorf("%s: GET /metrics = %d %s %.80q; want 401 %s", tc.name, a.status, a.code(), a.body, idem.ECodeUnauthenticated)
		}
	}
	a := n.do(http.MethodGet, "/metrics", "scrape-secret", nil, "")
	if a.status != http.StatusOK || !strings.Contains(string(a.body), "idempotency_requests_total") {
		t.Errorf("GET /metrics with the token = %d %.80q; want 200 with the series", a.status, a.body)
	}
}

// TestMetricsServedWithoutTheStore: the gauge read from the store at
// scrape time fails when the store does; the scrape still answers 200 with
// every other series (a 500 would blank the node's whole dashboard and
// every alert on it), without that gauge.
func TestMetricsServedWithoutTheStore(t *testing.T) {
	st, _ := storetest.New(t)
	n := newNodeOn(t, st, time.Hour)
	if got := n.series(); !got["idempotency_in_progress_age_max_seconds"] {
		t.Fatal("idempotency_in_progress_age_max_seconds is missing with the store up")
	}
	st.Close()
	got := n.series() // fails the test unless 200
	if got["idempotency_in_progress_age_max_seconds"] {
		t.Error("idempotency_in_progress_age_max_seconds served with the store closed")
	}
	if !got[`idempotency_requests_total{operation="create_payment",outcome="execute"}`] {
		t.Error("the node's other series are missing with the store closed")
	}
}

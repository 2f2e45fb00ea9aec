package chaos

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/net/html"

	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/payments"
)

// TestSerialiseSameCommand checks the workload's re-serialisations against
// the service's own parser: every variant is the same normalised command,
// with the same fingerprint, and most variants differ in their bytes.
func TestSerialiseSameCommand(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		c := Command{
			AccountID: "acc_1", AmountMinor: int64(1 + rng.IntN(200000)), Currency: currencies[rng.IntN(len(currencies))],
			MerchantReference: "ref-" + string(rune('a'+i%26)), Channel: channels[rng.IntN(len(channels))],
		}
		if i%7 == 0 {
			c.AmountMinor = int64(rng.IntN(100)+1) * 100 // whole amounts: "10", "10.0"
		}
		canon := c.Serialise(0, rng)
		want, err := payments.ParseCommand(canon, "")
		if err != nil {
			t.Fatalf("canonical %s: %v", canon, err)
		}
		wantHash, _ := want.Fingerprint()
		distinct := map[string]bool{string(canon): true}
		for v := 1; v <= 20; v++ {
			b := c.Serialise(v, rng)
			distinct[string(b)] = true
			got, err := payments.ParseCommand(b, "")
			if err != nil {
				t.Fatalf("variant %s of %s: %v", b, canon, err)
			}
			if got != want {
				t.Fatalf("variant %s parses to %+v, canonical %s to %+v", b, got, canon, want)
			}
			if h, _ := got.Fingerprint(); !slices.Equal(h, wantHash) {
				t.Fatalf("variant %s has fingerprint %v, want %v", b, h, wantHash)
			}
		}
		if len(distinct) < 5 {
			t.Errorf("only %d distinct serialisations of %s", len(distinct), canon)
		}
		if want.AmountMinor != c.AmountMinor || want.Currency != c.Currency || want.MerchantReference != c.MerchantReference {
			t.Fatalf("canonical %s parses to %+v, want %+v", canon, want, c)
		}
	}
}

// op builds a history entry for the model tests.
func op(key, cmd string, start, end int, status int, code string, replayed bool, answer string) *Op {
	return &Op{
		Tenant: "t", Key: key, CommandID: cmd, Start: time.Duration(start) * time.Millisecond, End: time.Duration(end) * time.Millisecond,
		Status: status, ErrorCode: code, Replayed: replayed, RespHash: answer,
	}
}

func TestModel(t *testing.T) {
	timeout := op("k", "A", 0, 2000, 0, "", false, "")
	timeout.Err = errTimeout
	cases := []struct {
		name      string
		ops       []*Op
		reexecute bool
		ok        bool
	}{
		{"execute then replays", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", true, "a1"), op("k", "A", 40, 50, 201, "", true, "a1")}, false, true},
		{"replay of another answer", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", true, "a2")}, false, false},
		{"executed twice", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", false, "a1")}, false, false},
		{"executed twice after a failover", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", false, "a1")}, true, true},
		{"re-executed with another answer after a failover", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", false, "a2")}, true, false},
		{"concurrent executions", []*Op{op("k", "A", 0, 100, 201, "", false, "a1"), op("k", "A", 10, 90, 201, "", false, "a1")}, false, false},
		{"concurrent execution and replay", []*Op{op("k", "A", 0, 100, 201, "", true, "a1"), op("k", "A", 10, 90, 201, "", false, "a1")}, false, true},
		{"replay with nothing before", []*Op{op("k", "A", 0, 10, 201, "", true, "a1")}, false, false},
		{"timeout, then a replay (recovery answered)", []*Op{timeout, op("k", "A", 3000, 3010, 201, "", true, "a1")}, false, true},
		{"timeout, then the retry executes", []*Op{timeout, op("k", "A", 3000, 3010, 201, "", false, "a1")}, false, true},
		{"202 then a replay", []*Op{op("k", "A", 0, 10, 202, codeOutcomeUnknown, false, "u"), op("k", "A", 20, 30, 201, "", true, "a1")}, false, true},
		{"in progress then execution", []*Op{op("k", "A", 0, 100, 201, "", false, "a1"), op("k", "A", 10, 20, 409, codeInProgress, false, "p")}, false, true},
		{"in progress with nothing claimed", []*Op{op("k", "A", 0, 10, 409, codeInProgress, false, "p")}, false, false},
		{"key reused", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "B", 20, 30, 409, codeKeyReused, false, "c")}, false, true},
		{"key reused after a timeout", []*Op{timeout, op("k", "B", 3000, 3010, 409, codeKeyReused, false, "c")}, false, true},
		{"same command refused as reused", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 409, codeKeyReused, false, "c")}, false, false},
		{"reused command executed", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "B", 20, 30, 201, "", false, "b1")}, false, false},
		{"503 leaves nothing", []*Op{op("k", "A", 0, 10, 503, "STORE_UNAVAILABLE", false, "s"), op("k", "A", 20, 30, 201, "", false, "a1")}, false, true},
		{"duplicate reference is final", []*Op{op("k", "A", 0, 10, 409, codeDuplicateRef, false, "d"), op("k", "A", 20, 30, 409, codeDuplicateRef, true, "d")}, false, true},
		{"keys are independent", []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("j", "A", 0, 10, 201, "", false, "a9")}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := checkLinearizable(tc.ops, tc.reexecute, 10*time.Second, "")
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Result == porcupine.Ok; got != tc.ok {
				t.Errorf("linearizable = %v (%s, illegal %v), want %v", got, res.Result, res.Illegal, tc.ok)
			}
		})
	}
}

// TestModelVisualization writes porcupine's visualisation of an illegal
// history.
func TestModelVisualization(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lin.html")
	ops := []*Op{op("k", "A", 0, 10, 201, "", false, "a1"), op("k", "A", 20, 30, 201, "", false, "a1")}
	res, err := checkLinearizable(ops, false, 10*time.Second, path)
	if err != nil {
		t.Fatal(err)
	}
	if res.Result != porcupine.Illegal || len(res.Illegal) != 1 || res.Illegal[0] != "t/k#0" {
		t.Fatalf("result %s, illegal %v", res.Result, res.Illegal)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(b, []byte("<html")) {
		t.Fatalf("visualisation: %v, %d bytes", err, len(b))
	}
}

// TestNodeControl runs the idemd wrapper around a stand-in that prints its
// arguments and environment.
func TestNodeControl(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake-idemd")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"args: $*\"\necho \"skew: $IDEM_CLOCK_SKEW\"\necho \"fp: $IDEM_FAILPOINTS\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	nc, err := newNodeControl(dir, fake)
	if err != nil {
		t.Fatal(err)
	}
	run := func(node string) string {
		out, err := exec.CommandContext(context.Background(), nc.wrapper, "--listen", "x", "--node-id", node).CombinedOutput()
		if err != nil {
			t.Fatalf("wrapper: %v\n%s", err, out)
		}
		return string(out)
	}
	if got := run("eu-west-0"); got != "args: --listen x --node-id eu-west-0\nskew: \nfp: \n" {
		t.Errorf("without overrides:\n%s", got)
	}
	args, env := withFlag("--response-schema", "v3")(nil, nil)
	args, env = withEnv("IDEM_CLOCK_SKEW", "45s")(args, env)
	args, env = withEnv("IDEM_FAILPOINTS", "before-provider-call=1*sleep(1s);recovery-before-provider-call=sleep(2s)")(args, env)
	if err := nc.set("eu-west-0", args, env); err != nil {
		t.Fatal(err)
	}
	want := "args: --listen x --node-id eu-west-0 --response-schema v3\nskew: 45s\nfp: before-provider-call=1*sleep(1s);recovery-before-provider-call=sleep(2s)\n"
	if got := run("eu-west-0"); got != want {
		t.Errorf("with overrides:\n%s\nwant:\n%s", got, want)
	}
	if got := run("eu-west-1"); !strings.HasPrefix(got, "args: --listen x --node-id eu-west-1\nskew: \n") {
		t.Errorf("another node:\n%s", got)
	}
	args, env = withoutFlag("--response-schema", 1)(nc.overrides("eu-west-0"))
	args, env = withoutEnv("IDEM_CLOCK_SKEW")(args, env)
	if err := nc.set("eu-west-0", args, env); err != nil {
		t.Fatal(err)
	}
	if got := run("eu-west-0"); !strings.HasPrefix(got, "args: --listen x --node-id eu-west-0\nskew: \nfp: before") {
		t.Errorf("after removing overrides:\n%s", got)
	}
	if err := nc.set("x", []string{"--a b"}, nil); err == nil {
		t.Error("an argument with a space was accepted")
	}
}

func TestCatalogue(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Catalogue() {
		if s.Name == "" || s.Description == "" || s.Faults == nil || seen[s.Name] {
			t.Errorf("scenario %q: empty field or duplicate", s.Name)
		}
		seen[s.Name] = true
		steps := s.Faults(&Env{}, DefaultRegions())
		if len(steps) == 0 {
			t.Errorf("%s: no faults", s.Name)
		}
		for _, st := range steps {
			if st.Fault.Name() == "" {
				t.Errorf("%s: unnamed fault", s.Name)
			}
		}
	}
	for _, b := range BreakModes() {
		s, err := ScenarioFor(b)
		if err != nil || !slices.Contains(s.Catches, b) {
			t.Errorf("ScenarioFor(%s) = %s, %v; it must list the break in Catches", b, s.Name, err)
		}
	}
	if _, err := Lookup("nope"); err == nil {
		t.Error("Lookup of an unknown scenario succeeded")
	}
}

// sampleReport is a report with a failed check, for the HTML test.
func sampleReport() *Report {
	o1 := op("k1", "A", 100, 120, 201, "", false, "aaaaaaaaaaaaaaaa")
	o2 := op("k1", "A", 300, 320, 201, "", true, "bbbbbbbbbbbbbbbb")
	o2.Body, o2.RespBody = `{"amount":"10.0"}`, `{"paymentId":"pay_1"}`
	sr := ScenarioReport{
		Name: "completed-replay", Description: "d <b>not bold</b>", Regions: []string{"eu-west", "us-east"}, NodesPerRegion: 2,
		Valid: true, Faults: []FaultEvent{{Name: "kill-node(us-east-0)", Hold: "2s", At: 1, HealAt: 3, HealedAt: 3.1, RecoveredAt: 3.5, Notes: []string{"n"}}},
		Checks: []CheckResult{
			{Name: CheckLinearizable, Passed: false, Details: "1 of 1 keys", Visualization: "linearizability.html",
				CounterExamples: []CounterExample{{Key: "t/k1#0", Summary: "no linearization", Ops: []*Op{o1, o2}}}},
			{Name: CheckSingleCharge, Passed: true, Details: "ok"},
		},
	}
	sr.summarise([]*Op{o1, o2})
	r := &Report{Scenario: "completed-replay", Seed: 1, Scenarios: []ScenarioReport{sr}}
	r.finish()
	return r
}

func TestReportHTML(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := r.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	checkHTML(t, b.String(), r)
	if !strings.Contains(b.String(), "d &lt;b&gt;not bold&lt;/b&gt;") {
		t.Error("the description was not escaped")
	}
	if !strings.Contains(b.String(), `href="completed-replay/linearizability.html"`) {
		t.Error("no link to porcupine's visualisation")
	}
}

// checkHTML parses a report page and checks its structure: one html, head,
// title and body; an SVG plot per scenario with data; a row per check; no
// script, stylesheet link, image or external URL.
func checkHTML(t *testing.T, page string, r *Report) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatalf("parse report.html: %v", err)
	}
	count := map[string]int{}
	var text strings.Builder
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			count[n.Data]++
			if n.Data == "title" && n.Parent != nil && n.Parent.Data == "head" {
				count["head title"]++
			}
			for _, a := range n.Attr {
				if (a.Key == "src" || a.Key == "href") && (strings.Contains(a.Val, "://") || strings.HasPrefix(a.Val, "//")) {
					t.Errorf("external reference <%s %s=%q>", n.Data, a.Key, a.Val)
				}
			}
		}
		if n.Type == html.TextNode {
			text.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	for _, el := range []string{"html", "head", "head title", "body", "style"} {
		if count[el] != 1 {
			t.Errorf("<%s> appears %d times, want once", el, count[el])
		}
	}
	for _, el := range []string{"script", "link", "img", "iframe"} {
		if count[el] > 0 {
			t.Errorf("<%s> in a self-contained report", el)
		}
	}
	if want := 2 * len(r.Scenarios); count["svg"] != want {
		t.Errorf("%d <svg> plots, want %d", count["svg"], want)
	}
	if count["rect"] < 2 || count["polyline"] < 1 {
		t.Errorf("plots without data: %d rect, %d polyline", count["rect"], count["polyline"])
	}
	for _, s := range r.Scenarios {
		for _, c := range s.Checks {
			if !strings.Contains(text.String(), c.Name) {
				t.Errorf("check %s is not in the page", c.Name)
			}
		}
		for _, f := range s.Faults {
			if !strings.Contains(text.String(), f.Name) {
				t.Errorf("fault %s is not in the page", f.Name)
			}
		}
	}
}

// TestRegionalEffects: a ledger entry or receipt repeated, once in each of
// two regions or twice in one store, is a violation: the nodes claim every
// effect once across regions (outbox.EffectGuard), so no repetition is a
// documented trade-off any more.
func TestRegionalEffects(t *testing.T) {
	st := &dbState{
		Ledger: map[[3]string]int{
			{"eu-west", "payment_created", "pay_1"}: 1, {"us-east", "payment_created", "pay_1"}: 1,
			{"eu-west", "payment_created", "pay_2"}: 2,
		},
		Notifications: map[[2]string]int{{"eu-west", "pay_1"}: 1, {"us-east", "pay_1"}: 1},
		Sent:          map[string]int{"receipt_payment_pay_1": 2},
		SentByStore:   map[[2]string]int{{"eu-west", "receipt_payment_pay_1"}: 1, {"us-east", "receipt_payment_pay_1"}: 1},
	}
	ledger := checkSingleLedger(&checkInput{st: st})
	if ledger.Passed || ledger.Warnings != 0 || len(ledger.CounterExamples) != 2 {
		t.Errorf("ledger: passed %v, %d warnings, %d counter-examples; want a failure for pay_1 and pay_2", ledger.Passed, ledger.Warnings, len(ledger.CounterExamples))
	}
	email := checkSingleEmail(&checkInput{st: st})
	if email.Passed || email.Warnings != 0 || len(email.CounterExamples) != 2 {
		t.Errorf("email: passed %v, %d warnings, %d counter-examples; want failures for the notification and the send", email.Passed, email.Warnings, len(email.CounterExamples))
	}
}

// TestSidecarChecksCatch: the sidecar checks fail on a derived key executed
// twice, a 2xx answer never executed, answers that differ, a sweep that is
// not a replay and a retry refused as a different request; and pass on a
// clean history.
func TestSidecarChecksCatch(t *testing.T) {
	ok := SidecarAnswer{Node: "eu-west-0", Status: 201, Body: `{"transfer":"tr_1"}`}
	replay := ok
	replay.Replayed, replay.Sweep = true, true
	key := func(name string, answers ...SidecarAnswer) *sidecarKey {
		return &sidecarKey{Tenant: "tenant-a", Key: name, Derived: "d-" + name, Answers: answers}
	}
	passed := func(res CheckResult) bool { return res.Passed && !res.Skipped }
	clean := &sidecarResult{keys: []*sidecarKey{key("k", ok, SidecarAnswer{Status: 202}, ok, replay)}, executions: map[string]int{"d-k": 1}}
	if r := checkSidecarSingleExecution(&checkInput{sidecar: clean}); !passed(r) {
		t.Errorf("clean: %+v", r)
	}
	if r := checkSidecarIdenticalAnswers(&checkInput{sidecar: clean}); !passed(r) {
		t.Errorf("clean: %+v", r)
	}
	for name, sc := range map[string]*sidecarResult{
		"executed twice":  {keys: []*sidecarKey{key("k", ok)}, executions: map[string]int{"d-k": 2}},
		"never executed":  {keys: []*sidecarKey{key("k", ok)}, executions: map[string]int{}},
		"unknown derived": {keys: []*sidecarKey{key("k", ok)}, executions: map[string]int{"d-k": 1, "other": 1}},
	} {
		if r := checkSidecarSingleExecution(&checkInput{sidecar: sc}); r.Passed {
			t.Errorf("%s passed single execution", name)
		}
	}
	other := ok
	other.Body = `{"transfer":"tr_2"}`
	notReplay := ok
	notReplay.Sweep = true
	for name, k := range map[string]*sidecarKey{
		"answers differ": key("k", ok, other),
		"sweep executed": key("k", ok, notReplay),
		"false reuse":    key("k", SidecarAnswer{Status: 409, Body: `{"errorCode":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"}`}, ok),
	} {
		if r := checkSidecarIdenticalAnswers(&checkInput{sidecar: &sidecarResult{keys: []*sidecarKey{k}}}); r.Passed {
			t.Errorf("%s passed identical answers", name)
		}
	}
	if r := checkSidecarSingleExecution(&checkInput{}); !r.Skipped || !r.Passed {
		t.Errorf("no sidecar: %+v", r)
	}
}

// TestSidecarFormRetries: the form scenario's retries are the command's
// fields in other orders and spellings, which the sidecar's canonical form
// (fingerprint.ParseForm) reads as the same command; a repeated name keeps
// its values' order, and most retries differ from the first in their bytes.
func TestSidecarFormRetries(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := &sidecarTraffic{form: true}
	differ := 0
	for i := range 100 {
		k := &sidecarKey{fields: formCommand(rng, i)}
		k.Body = encodeForm(k.fields, true)
		want, err := fingerprint.ParseForm([]byte(k.Body), nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			retry := s.body(rng, k)
			got, err := fingerprint.ParseForm([]byte(retry), nil)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("retry %q reads as %v (%v), the command %q as %v", retry, got, err, k.Body, want)
			}
			if retry != k.Body {
				differ++
			}
		}
	}
	if differ < 450 {
		t.Errorf("%d of 500 retries differ from the first body", differ)
	}
}

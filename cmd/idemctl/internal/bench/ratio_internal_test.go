package bench

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRatioHasEachRoundsRatio: a ratio carries each round's ratio, the
// rounds' ops/s divided pairwise, and the report prints their spread.
func TestRatioHasEachRoundsRatio(t *testing.T) {
	results := []Result{
		{Name: "a", OpsPerS: 300, RoundOpsPerS: []float64{200, 300, 400}},
		{Name: "b", OpsPerS: 400, RoundOpsPerS: []float64{400, 400, 400}},
	}
	r := ratio(results, "a", "b")
	if r.Value != 0.75 {
		t.Errorf("value %v, want 0.75", r.Value)
	}
	want := []float64{0.5, 0.75, 1}
	if len(r.Rounds) != len(want) {
		t.Fatalf("rounds %v, want %v", r.Rounds, want)
	}
	for i := range want {
		if r.Rounds[i] != want[i] {
			t.Errorf("round %d: %v, want %v", i+1, r.Rounds[i], want[i])
		}
	}
	if lo, hi := r.Spread(); lo != 0.5 || hi != 1 {
		t.Errorf("spread %v to %v, want 0.5 to 1", lo, hi)
	}
	md := Report{Suites: []SuiteReport{{Suite: "s", Ratios: []Ratio{r}}}}.Markdown()
	if !strings.Contains(md, "ratio a/b: **0.750** (rounds 0.500 to 1.000)") {
		t.Errorf("report does not show the rounds' spread:\n%s", md)
	}

	// One round, or results without rounds: no spread to show.
	one := ratio([]Result{{Name: "a", OpsPerS: 1, RoundOpsPerS: []float64{1}}, {Name: "b", OpsPerS: 2, RoundOpsPerS: []float64{2}}}, "a", "b")
	if len(one.Rounds) != 0 {
		t.Errorf("one round: rounds %v, want none", one.Rounds)
	}
	md = Report{Suites: []SuiteReport{{Suite: "s", Ratios: []Ratio{one}}}}.Markdown()
	if strings.Contains(md, "rounds") {
		t.Errorf("one round printed a spread:\n%s", md)
	}
}

// TestAlternateKeepsEachRound: each operation's result holds one ops/s
// per round, and its ops/s over all rounds lies within them.
func TestAlternateKeepsEachRound(t *testing.T) {
	tick := func(d time.Duration) func(context.Context) error {
		return func(context.Context) error { time.Sleep(d); return nil }
	}
	cfg := Config{Concurrency: 2, PhaseDuration: 30 * time.Millisecond, Rounds: 3}
	results, err := alternate(context.Background(), cfg, "t", []op{{"fast", tick(time.Millisecond)}, {"slow", tick(3 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if len(r.RoundOpsPerS) != cfg.Rounds {
			t.Fatalf("%s: %d rounds' ops/s, want %d", r.Name, len(r.RoundOpsPerS), cfg.Rounds)
		}
		lo, hi := r.RoundOpsPerS[0], r.RoundOpsPerS[0]
		for _, x := range r.RoundOpsPerS {
			if x <= 0 {
				t.Errorf("%s: a round of %v ops/s", r.Name, x)
			}
			lo, hi = min(lo, x), max(hi, x)
		}
		// The whole is a weighted mean of the rounds.
		if r.OpsPerS < lo*0.999 || r.OpsPerS > hi*1.001 {
			t.Errorf("%s: %v ops/s overall, outside its rounds %v", r.Name, r.OpsPerS, r.RoundOpsPerS)
		}
	}
	if got := ratio(results, "fast", "slow"); len(got.Rounds) != cfg.Rounds {
		t.Errorf("ratio rounds %v, want %d", got.Rounds, cfg.Rounds)
	}
}

// TestCoresBusyIsCPUOverTime: a result's cores busy is the process's and
// the backends' CPU over the phases' time, shown in the report, and 0
// when a phase's CPU could not be measured.
func TestCoresBusyIsCPUOverTime(t *testing.T) {
	p := phaseStats{ops: 1000, elapsed: 4 * time.Second, cpu: cpuSample{client: 3 * time.Second, server: 2 * time.Second},
		cpuPhases: 2, phases: 2}
	r := p.result("a")
	if r.CoresBusy != 1.25 {
		t.Errorf("cores busy %v, want 1.25", r.CoresBusy)
	}
	if r.ClientCPUPerOp != 3000 || r.DBCPUPerOp != 2000 {
		t.Errorf("CPU per op %v + %v, want 3000 + 2000", r.ClientCPUPerOp, r.DBCPUPerOp)
	}
	md := Report{Suites: []SuiteReport{{Suite: "s", Results: []Result{r}}}}.Markdown()
	if !strings.Contains(md, "| 3000 | 2000 | 1.25 |") {
		t.Errorf("report does not show the cores busy:\n%s", md)
	}

	p.cpuPhases = 1
	if r := p.result("a"); r.CoresBusy != 0 {
		t.Errorf("a phase not measured: cores busy %v, want 0", r.CoresBusy)
	}
}

// TestAlternateReversesEvenRounds: odd rounds run the phases in the order
// listed, even rounds in reverse, so that no op is always measured after
// the others, on the tables they grew.
func TestAlternateReversesEvenRounds(t *testing.T) {
	var (
		mu  sync.Mutex
		ran []string // the phases in the order they ran, repeats collapsed
	)
	mark := func(name string) op {
		return op{name, func(context.Context) error {
			mu.Lock()
			if len(ran) == 0 || ran[len(ran)-1] != name {
				ran = append(ran, name)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil
		}}
	}
	cfg := Config{Concurrency: 2, PhaseDuration: 10 * time.Millisecond, Rounds: 4}
	results, err := alternate(context.Background(), cfg, "t", []op{mark("a"), mark("b"), mark("c")})
	if err != nil {
		t.Fatal(err)
	}
	// a b c | c b a | a b c | c b a, with the repeats at the turns collapsed.
	if want := []string{"a", "b", "c", "b", "a", "b", "c", "b", "a"}; !slices.Equal(ran, want) {
		t.Errorf("phases ran %v, want %v", ran, want)
	}
	// Results stay in the order listed, each round's ops/s in round order.
	for i, name := range []string{"a", "b", "c"} {
		if results[i].Name != name || len(results[i].RoundOpsPerS) != cfg.Rounds {
			t.Errorf("result %d: %s with %d rounds, want %s with %d", i, results[i].Name, len(results[i].RoundOpsPerS), name, cfg.Rounds)
		}
	}
}

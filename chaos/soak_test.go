package chaos

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// series makes a series sampled every step seconds over d seconds with
// value f(t).
func series(d, step float64, f func(t float64) float64) []Point {
	var out []Point
	for t := step; t <= d+1e-9; t += step {
		out = append(out, Point{T: t, V: f(t)})
	}
	return out
}

func constStarts(n int, v float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestSoakWindow(t *testing.T) {
	for _, tc := range []struct {
		d, want time.Duration
	}{
		{time.Hour, 10 * time.Minute},
		{40 * time.Minute, 10 * time.Minute},
		{20 * time.Minute, 5 * time.Minute},
		{4 * time.Minute, time.Minute},
	} {
		if got := SoakWindow(tc.d); got != tc.want {
			t.Errorf("SoakWindow(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestThroughputDrift(t *testing.T) {
	const hour = 3600.0
	for _, tc := range []struct {
		name string
		f    func(t float64) float64
		want bool
	}{
		{"flat", func(float64) float64 { return 500 }, true},
		{"noisy but flat", func(t float64) float64 { return 500 + 40*math.Sin(t/37) }, true},
		{"5% lower at the end", func(t float64) float64 { return 500 - 25*t/hour }, true},
		// The decline of the 50-minute soak: 450-520 calls/s, then 419, 351,
		// 320, 310, 293 in its last five 2-minute intervals.
		{"falls after 40 minutes", func(t float64) float64 {
			if t < 40*60 {
				return 480
			}
			return 480 - 190*(t-40*60)/(20*60)
		}, false},
		{"rises by a quarter", func(t float64) float64 { return 400 + 100*t/hour }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ThroughputDrift(series(hour, 30, tc.f), hour, SoakWindow(time.Hour))
			if got.Passed != tc.want {
				t.Errorf("Passed = %t, want %t (%s)", got.Passed, tc.want, got.Detail)
			}
			if got.Samples != [2]int{20, 20} {
				t.Errorf("samples per window = %v, want [20 20]", got.Samples)
			}
		})
	}
}

func TestThroughputDriftWithoutSamples(t *testing.T) {
	got := ThroughputDrift(nil, 600, time.Minute)
	if got.Passed {
		t.Errorf("Passed with no samples: %+v", got)
	}
	// A run that stopped before its last window has no samples there.
	got = ThroughputDrift(series(100, 10, func(float64) float64 { return 1 }), 1000, time.Minute)
	if got.Passed {
		t.Errorf("Passed with an empty last window: %+v", got)
	}
}

func TestP99Drift(t *testing.T) {
	const d = 1200.0
	for _, tc := range []struct {
		name string
		f    func(t float64) float64
		want bool
	}{
		{"flat", func(float64) float64 { return 40 }, true},
		{"one fault spike per window", func(t float64) float64 {
			if int(t)%300 == 60 {
				return 900
			}
			return 40
		}, true},
		{"small p99 moves by a few ms", func(t float64) float64 { return 3 + 4*t/d }, true},
		{"doubles", func(t float64) float64 { return 40 + 40*t/d }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := P99Drift(series(d, 30, tc.f), d, SoakWindow(20*time.Minute))
			if got.Passed != tc.want {
				t.Errorf("Passed = %t, want %t (%s)", got.Passed, tc.want, got.Detail)
			}
		})
	}
}

func TestSplitAtRestarts(t *testing.T) {
	pts := series(100, 10, func(t float64) float64 { return t })
	starts := []float64{1, 1, 1, 0, 2, 2, 2, 3, 3, 3}
	segs := SplitAtRestarts(pts, starts)
	if len(segs) != 3 {
		t.Fatalf("got %d segments, want 3: %+v", len(segs), segs)
	}
	for i, want := range []struct{ from, to float64 }{{10, 30}, {50, 70}, {80, 100}} {
		if segs[i].From != want.from || segs[i].To != want.to {
			t.Errorf("segment %d = %v-%v, want %v-%v", i, segs[i].From, segs[i].To, want.from, want.to)
		}
	}
}

func TestLevelsOff(t *testing.T) {
	const hour = 3600.0
	const mb = 1 << 20
	warm, span := 180.0, 600.0
	for _, tc := range []struct {
		name   string
		f      func(t float64) float64
		starts func(n int) []float64
		judged bool
		want   bool
	}{
		// The nodes of the 50-minute soak: 36.5 MB at 2 minutes, 38.2-39.2
		// MB from minute 6 to 50.
		{"warms up then flat", func(t float64) float64 {
			if t < 360 {
				return 30*mb + 8.5*mb*t/360
			}
			return 38.2*mb + 1*mb*math.Sin(t/300)
		}, nil, true, true},
		{"leaks 1 KB per second", func(t float64) float64 { return 38*mb + 1024*t }, nil, true, true},
		{"leaks 20 KB per second", func(t float64) float64 { return 38*mb + 20*1024*t }, nil, true, false},
		{"grows like a square root", func(t float64) float64 { return 30*mb + 0.2*mb*math.Sqrt(t) }, nil, true, true},
		{"leak resets at a restart, still a leak", func(t float64) float64 {
			return 38*mb + 20*1024*math.Mod(t, 1800)
		}, func(n int) []float64 {
			out := constStarts(n, 1)
			for i := n / 2; i < n; i++ {
				out[i] = 2
			}
			return out
		}, true, false},
		{"restarted too often to judge", func(t float64) float64 { return 38 * mb }, func(n int) []float64 {
			out := make([]float64, n)
			for i := range out {
				out[i] = float64(i / 10) // a new process every 5 minutes
			}
			return out
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pts := series(hour, 30, tc.f)
			starts := constStarts(len(pts), 1)
			if tc.starts != nil {
				starts = tc.starts(len(pts))
			}
			got := LevelsOff("n rss", pts, starts, hour, warm, span, 8*mb)
			if got.Judged != tc.judged || (got.Judged && got.Passed != tc.want) {
				t.Errorf("Judged %t Passed %t, want Judged %t Passed %t (%s)", got.Judged, got.Passed, tc.judged, tc.want, got.Detail)
			}
		})
	}
}

func TestLevelsOffGoroutines(t *testing.T) {
	const hour = 3600.0
	flat := series(hour, 30, func(t float64) float64 { return 71 + float64(int(t)%7) })
	if g := LevelsOff("g", flat, constStarts(len(flat), 1), hour, 180, 600, 10); !g.Passed {
		t.Errorf("flat goroutines fail: %s", g.Detail)
	}
	// One goroutine leaked every 20 s: 180 over the hour.
	leak := series(hour, 30, func(t float64) float64 { return 71 + t/20 })
	if g := LevelsOff("g", leak, constStarts(len(leak), 1), hour, 180, 600, 10); g.Passed {
		t.Errorf("a goroutine leak passes: %s", g.Detail)
	}
}

func TestSoakReportJudge(t *testing.T) {
	// A short soak whose throughput falls and whose one node leaks
	// descriptors: both checks fail, and the summary says so.
	// Its outbox falls behind by 40 events a second.
	r := &SoakReport{Counts: map[string]SoakCounts{SoakFresh: {Calls: 100, OK: 100}}, Calls: 100, Regions: []string{"eu-west"}}
	for i := 1; i <= 40; i++ {
		tt := float64(i * 30)
		r.Samples = append(r.Samples, SoakSample{T: tt, Rate: 500 - 5*float64(i), P99ms: 30,
			Nodes:  []NodeSample{{Name: "eu-west-0", StartTime: 1, RSSBytes: 40 << 20, Goroutines: 70, OpenFDs: 40 + tt/10}},
			Stores: []StoreSample{{Region: "eu-west", OutboxBacklog: int64(40 * tt), QueuePending: 150}}})
	}
	r.TrafficSeconds = 1200
	r.judge()
	failed := map[string]bool{}
	for _, c := range r.Checks {
		if !c.Passed {
			failed[c.Name] = true
		}
	}
	for name, want := range map[string]bool{"throughput-steady": true, "p99-steady": false, "rss-levels-off": false,
		"goroutines-levels-off": false, "fds-levels-off": true, "backlog-levels-off": true, "answers-as-contracted": false} {
		if failed[name] != want {
			t.Errorf("check %s failed = %t, want %t", name, failed[name], want)
		}
	}
	if r.Passed {
		t.Error("report passed")
	}
	var b strings.Builder
	r.Summary(&b)
	if !strings.Contains(b.String(), "FAIL fds-levels-off") {
		t.Errorf("summary does not name the failed check:\n%s", b.String())
	}
	if svg := r.SVG(); !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "eu-west-0") {
		t.Errorf("SVG lacks the node's line: %.200s", svg)
	}
	var h strings.Builder
	if err := r.WriteHTML(&h); err != nil || !strings.Contains(h.String(), "fds-levels-off") {
		t.Errorf("WriteHTML: %v", err)
	}

	// Written and read back, it is judged the same.
	dir := t.TempDir()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadSoakReport(filepath.Join(dir, "soak.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Checks) != len(r.Checks) || back.Passed != r.Passed {
		t.Fatalf("read back: %d checks, passed %t; want %d, %t", len(back.Checks), back.Passed, len(r.Checks), r.Passed)
	}
	for i, c := range back.Checks {
		if c.Name != r.Checks[i].Name || c.Passed != r.Checks[i].Passed {
			t.Errorf("read back: check %s passed %t, want %s %t", c.Name, c.Passed, r.Checks[i].Name, r.Checks[i].Passed)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 71
process_resident_memory_bytes 3.8e+07
idempotency_requests_total{operation="create_payment",outcome="execute"} 12
`))
	if err != nil {
		t.Fatal(err)
	}
	if m["go_goroutines"] != 71 || m["process_resident_memory_bytes"] != 3.8e7 {
		t.Errorf("got %v", m)
	}
	if _, ok := m["idempotency_requests_total"]; ok {
		t.Error("a labelled sample was read as unlabelled")
	}
}

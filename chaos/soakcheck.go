package chaos

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// The soak's verdicts are computed from its samples by the pure functions
// of this file, so that each rule can be tested on series made up for it.

// Bounds of the soak's checks.
const (
	// SoakDriftWindow is the window whose throughput is compared at the
	// start and the end of a soak long enough for it (SoakWindow).
	SoakDriftWindow = 10 * time.Minute
	// SoakThroughputTolerance is how far the last window's mean throughput
	// may lie from the first window's, as a fraction of the first.
	SoakThroughputTolerance = 0.10
	// SoakP99Tolerance is how much the last window's p99 latency (the
	// median of its samples' p99) may exceed the first window's, as a
	// fraction of the first, plus SoakP99Slack.
	SoakP99Tolerance = 0.50
	// SoakP99Slack is added to the p99 bound, so that a p99 of a few
	// milliseconds may move by a few.
	SoakP99Slack = 5 * time.Millisecond
	// SoakGrowthTolerance is how much a node's memory, goroutines or
	// descriptors may still grow over the run's length at the rate of the
	// last half of a judged stretch, as a fraction of their median level
	// (or the resource's absolute slack, whichever is larger).
	SoakGrowthTolerance = 0.10
)

// SoakWindow returns the window compared at the start and end of a run of
// duration d: SoakDriftWindow for runs of at least four times it, a quarter
// of the run for shorter ones.
func SoakWindow(d time.Duration) time.Duration {
	if d >= 4*SoakDriftWindow {
		return SoakDriftWindow
	}
	return d / 4
}

// Point is one value of a series at T seconds from the start of traffic.
type Point struct {
	T float64 `json:"t"`
	V float64 `json:"v"`
}

// windowMean returns the mean of the values of pts with from <= T < to
// (each sample stands for the interval that ended at T) and how many there
// were.
func windowValues(pts []Point, from, to float64) []float64 {
	var out []float64
	for _, p := range pts {
		if p.T > from && p.T <= to+1e-9 {
			out = append(out, p.V)
		}
	}
	return out
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// DriftResult compares a series' first and last windows.
type DriftResult struct {
	Window  string  `json:"window"`
	First   float64 `json:"first"`
	Last    float64 `json:"last"`
	Change  float64 `json:"change"` // (last-first)/first
	Bound   string  `json:"bound"`
	Passed  bool    `json:"passed"`
	Samples [2]int  `json:"samples"`
	Detail  string  `json:"detail"`
}

// ThroughputDrift compares the mean throughput (calls/s) of the first and
// the last window of a run that lasted end seconds: it passes when the last
// is within SoakThroughputTolerance of the first. A window without samples
// fails: there is nothing to compare.
func ThroughputDrift(rate []Point, end float64, window time.Duration) DriftResult {
	w := window.Seconds()
	first, last := windowValues(rate, 0, w), windowValues(rate, end-w, end)
	r := DriftResult{Window: window.String(), First: mean(first), Last: mean(last), Samples: [2]int{len(first), len(last)},
		Bound: fmt.Sprintf("within %.0f%% of the first window", SoakThroughputTolerance*100)}
	if len(first) == 0 || len(last) == 0 || r.First <= 0 {
		r.Detail = "not enough samples in the first or last window"
		return r
	}
	r.Change = (r.Last - r.First) / r.First
	r.Passed = math.Abs(r.Change) <= SoakThroughputTolerance
	r.Detail = fmt.Sprintf("first %s: %.1f calls/s, last %s: %.1f calls/s (%+.1f%%)", window, r.First, window, r.Last, 100*r.Change)
	return r
}

// P99Drift compares the median of the per-sample p99 latencies (ms) of the
// first and the last window: the last may exceed the first by
// SoakP99Tolerance of it plus SoakP99Slack. The median keeps one sample
// taken during a fault from deciding.
func P99Drift(p99 []Point, end float64, window time.Duration) DriftResult {
	w := window.Seconds()
	first, last := windowValues(p99, 0, w), windowValues(p99, end-w, end)
	slack := float64(SoakP99Slack) / float64(time.Millisecond)
	r := DriftResult{Window: window.String(), First: median(first), Last: median(last), Samples: [2]int{len(first), len(last)},
		Bound: fmt.Sprintf("at most %.0f%% + %v above the first window", SoakP99Tolerance*100, SoakP99Slack)}
	if len(first) == 0 || len(last) == 0 {
		r.Detail = "not enough samples in the first or last window"
		return r
	}
	if r.First > 0 {
		r.Change = (r.Last - r.First) / r.First
	}
	r.Passed = r.Last <= r.First*(1+SoakP99Tolerance)+slack
	r.Detail = fmt.Sprintf("median p99 first %s: %.1f ms, last %s: %.1f ms", window, r.First, window, r.Last)
	return r
}

// Segment is a stretch of one process's series between restarts.
type Segment struct {
	From, To float64 // seconds
	Points   []Point
}

// SplitAtRestarts cuts a series where the process's start time changes (a
// restart begins a new process, whose memory starts afresh) or where the
// process could not be sampled (start 0).
func SplitAtRestarts(pts []Point, starts []float64) []Segment {
	var out []Segment
	var cur *Segment
	prev := math.NaN()
	for i, p := range pts {
		st := starts[i]
		if st == 0 || math.IsNaN(p.V) {
			cur = nil
			prev = math.NaN()
			continue
		}
		if cur == nil || st != prev {
			out = append(out, Segment{From: p.T})
			cur = &out[len(out)-1]
		}
		cur.Points = append(cur.Points, p)
		cur.To = p.T
		prev = st
	}
	return out
}

// slope fits v = a + b*t by least squares and returns b (per second).
func slope(pts []Point) float64 {
	if len(pts) < 2 {
		return 0
	}
	var st, sv float64
	for _, p := range pts {
		st += p.T
		sv += p.V
	}
	n := float64(len(pts))
	mt, mv := st/n, sv/n
	var num, den float64
	for _, p := range pts {
		num += (p.T - mt) * (p.V - mv)
		den += (p.T - mt) * (p.T - mt)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

// GrowthResult is the verdict on one process's resource.
type GrowthResult struct {
	Series string  `json:"series"` // "eu-west-0 rss"
	Judged bool    `json:"judged"`
	Passed bool    `json:"passed"`
	Level  float64 `json:"level"`  // median of the judged stretch
	Growth float64 `json:"growth"` // projected over the run at the final rate
	Bound  float64 `json:"bound"`
	Detail string  `json:"detail"`
}

// LevelsOff judges whether a series (one process's memory, goroutines or
// descriptors) stops growing: for every stretch between restarts long
// enough to judge (at least minSpan after its warm-up, the first quarter
// of the stretch or warmup, whichever is shorter), it fits a line to the
// last half of the stretch and projects that rate over the run's length
// (horizon seconds). Growth that would add more than SoakGrowthTolerance
// of the stretch's median level, and more than slack, fails: a leak keeps
// its rate to the end, a warm-up or a cache that fills levels off. A
// series with no stretch long enough is not judged (Judged false).
func LevelsOff(name string, pts []Point, starts []float64, horizon, warmup, minSpan float64, slack float64) GrowthResult {
	r := GrowthResult{Series: name, Passed: true}
	var judged []string
	for _, seg := range SplitAtRestarts(pts, starts) {
		skip := math.Min(warmup, (seg.To-seg.From)/4)
		var rest []Point
		for _, p := range seg.Points {
			if p.T >= seg.From+skip {
				rest = append(rest, p)
			}
		}
		if len(rest) < 4 || rest[len(rest)-1].T-rest[0].T < minSpan {
			continue
		}
		half := rest[len(rest)/2:]
		vals := make([]float64, len(rest))
		for i, p := range rest {
			vals[i] = p.V
		}
		level := median(vals)
		growth := slope(half) * horizon
		bound := math.Max(SoakGrowthTolerance*level, slack)
		ok := growth <= bound
		judged = append(judged, fmt.Sprintf("%.0f-%.0fs: level %s, growth over the run at the final rate %s (bound %s)",
			rest[0].T, rest[len(rest)-1].T, trimFloat(level), trimFloat(growth), trimFloat(bound)))
		if !r.Judged || (!ok && r.Passed) || (ok == r.Passed && growth-bound > r.Growth-r.Bound) {
			r.Level, r.Growth, r.Bound = level, growth, bound
		}
		r.Judged = true
		r.Passed = r.Passed && ok
	}
	if !r.Judged {
		r.Detail = "no stretch between restarts long enough to judge"
		return r
	}
	r.Detail = strings.Join(judged, "; ")
	return r
}

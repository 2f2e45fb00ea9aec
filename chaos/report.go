package chaos

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is the outcome of a run: report.json holds it as JSON.
type Report struct {
	Version  int    `json:"version"`
	Scenario string `json:"scenario"`
	// Env is the environment the clusters ran in (EnvProcess, EnvDocker).
	Env   string `json:"env,omitempty"`
	Seed  uint64 `json:"seed"`
	Break string `json:"break,omitempty"`
	// Command is the command line that reproduces the run (set by the
	// caller).
	Command   string           `json:"command,omitempty"`
	Started   time.Time        `json:"started"`
	Duration  string           `json:"duration"`
	Clients   int              `json:"clients"`
	MinRate   float64          `json:"minRate"`
	Passed    bool             `json:"passed"`
	Scenarios []ScenarioReport `json:"scenarios"`
}

// ScenarioReport is the outcome of one scenario.
type ScenarioReport struct {
	Name           string   `json:"name"`
	Description    string   `json:"description"`
	Seed           uint64   `json:"seed"`
	Break          string   `json:"break,omitempty"`
	Regions        []string `json:"regions,omitempty"`
	NodesPerRegion int      `json:"nodesPerRegion,omitempty"`
	StoreMode      string   `json:"storeMode,omitempty"`
	// Direct: the cluster ran without proxies (Scenario.Direct).
	Direct bool `json:"direct,omitempty"`
	// StoreLinksOnly: only the replicated store's links were proxied
	// (Scenario.StoreLinksOnly).
	StoreLinksOnly bool `json:"storeLinksOnly,omitempty"`
	// PgBouncer: the nodes reached their store through PgBouncer in
	// transaction pooling (Scenario.PgBouncer).
	PgBouncer bool      `json:"pgbouncer,omitempty"`
	NodeArgs  []string  `json:"nodeArgs,omitempty"`
	Clients   int       `json:"clients,omitempty"`
	Started   time.Time `json:"started"`
	// Elapsed is the scenario's whole time, cluster start to stop;
	// TrafficSeconds how long clients sent requests (drain included).
	Elapsed        string  `json:"elapsed,omitempty"`
	TrafficSeconds float64 `json:"trafficSeconds,omitempty"`
	// Valid is false when the traffic before the first fault was below
	// MinRate (WarmupRate calls/s): the run proves nothing.
	Valid      bool    `json:"valid"`
	Invalid    string  `json:"invalid,omitempty"`
	MinRate    float64 `json:"minRate"`
	WarmupRate float64 `json:"warmupRate"`
	// Error is a harness failure (the scenario could not run).
	Error string `json:"error,omitempty"`
	// StartRetries lists the failed attempts to start the cluster before
	// the one that worked.
	StartRetries []string `json:"startRetries,omitempty"`
	// IdleTenants is how many idle tenants were placed before the traffic
	// (Scenario.IdleTenants).
	IdleTenants int `json:"idleTenants,omitempty"`
	Ops         int `json:"ops"`
	Keys        int `json:"keys"`
	// SidecarCalls counts the calls of a sidecar scenario's sidecar
	// clients (each checked by the sidecar checks), beside the workload's
	// Ops.
	SidecarCalls int `json:"sidecarCalls,omitempty"`
	// GRPCCalls counts the calls of a gRPC scenario's clients (each
	// checked by the gRPC checks), beside the workload's.
	GRPCCalls int `json:"grpcCalls,omitempty"`
	// Redirected counts the calls a node refused (a dead process) that
	// went on to another node, as a client with several endpoints does.
	Redirected int            `json:"redirected,omitempty"`
	Outcomes   map[string]int `json:"outcomes,omitempty"`
	Faults     []FaultEvent   `json:"faults"`
	// Drill holds the figures of a failover-type scenario (nil for the
	// others): its first region fault's. Drills has every region fault's
	// (a scenario may take regions down in phases).
	Drill     *Drill        `json:"drill,omitempty"`
	Drills    []*Drill      `json:"drills,omitempty"`
	Checks    []CheckResult `json:"checks"`
	Passed    bool          `json:"passed"`
	Failed    []string      `json:"failedChecks,omitempty"`
	Series    []Bucket      `json:"series,omitempty"`
	History   string        `json:"history,omitempty"`
	Logs      string        `json:"logs,omitempty"`
	Artifacts []string      `json:"artifacts,omitempty"`
}

// FaultEvent is one fault in a scenario's timeline; times are seconds from
// the start of the traffic.
type FaultEvent struct {
	Name string `json:"name"`
	Hold string `json:"hold"`
	// At is when Inject began, InjectedFor how long it took (a failover
	// waits for a lease to lapse), HealAt when Heal began, HealedAt when it
	// returned, RecoveredAt when the cluster was healthy again.
	At          float64 `json:"at"`
	InjectedFor float64 `json:"injectedFor"`
	HealAt      float64 `json:"healAt"`
	HealedAt    float64 `json:"healedAt"`
	RecoveredAt float64 `json:"recoveredAt"`
	// CutAt, for a fault that says when it took effect (a partition made
	// of several commands), is that moment; drills measure from it.
	CutAt           float64  `json:"cutAt,omitempty"`
	Skipped         string   `json:"skipped,omitempty"`
	PreHealthError  string   `json:"preHealthError,omitempty"`
	InjectError     string   `json:"injectError,omitempty"`
	HealError       string   `json:"healError,omitempty"`
	PostHealthError string   `json:"postHealthError,omitempty"`
	Notes           []string `json:"notes,omitempty"`
}

// Bucket is one second of traffic: calls that ended in it by class, and
// their latency (the sweep after the faults left out).
type Bucket struct {
	T         int     `json:"t"`
	Definite  int     `json:"definite"`
	Ambiguous int     `json:"ambiguous"`
	Other     int     `json:"other"`
	P50ms     float64 `json:"p50ms"`
	P99ms     float64 `json:"p99ms"`
}

// summarise fills in the counts, the series and the verdict.
func (sr *ScenarioReport) summarise(ops []*Op) {
	sr.Ops = len(ops)
	sr.Outcomes = map[string]int{}
	keys := map[string]bool{}
	var maxT time.Duration
	for _, o := range ops {
		sr.Outcomes[o.Outcome()]++
		keys[o.partitionKey()] = true
		if o.RedirectedFrom != "" {
			sr.Redirected++
		}
		if !o.Sweep {
			maxT = max(maxT, o.End)
		}
	}
	sr.Keys = len(keys)
	n := int(maxT/time.Second) + 1
	buckets := make([]Bucket, n)
	lat := make([][]float64, n)
	for i := range buckets {
		buckets[i].T = i
	}
	for _, o := range ops {
		i := int(o.End / time.Second)
		if i < 0 || i >= n || o.Sweep {
			continue // the sweep after the faults is not traffic
		}
		switch o.Class() {
		case ClassFinal, ClassConflict:
			buckets[i].Definite++
		case ClassAmbiguous:
			buckets[i].Ambiguous++
		default:
			buckets[i].Other++
		}
		lat[i] = append(lat[i], float64(o.End-o.Start)/float64(time.Millisecond))
	}
	for i := range buckets {
		buckets[i].P50ms, buckets[i].P99ms = percentile(lat[i], 0.5), percentile(lat[i], 0.99)
	}
	sr.Series = buckets
	sr.verdict()
}

func (sr *ScenarioReport) verdict() {
	sr.Failed = nil
	for _, c := range sr.Checks {
		if !c.Passed {
			sr.Failed = append(sr.Failed, c.Name)
		}
	}
	sr.Passed = sr.Error == "" && sr.Valid && len(sr.Failed) == 0 && len(sr.Checks) > 0
}

func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// finish computes the run's verdict.
func (r *Report) finish() {
	r.Passed = len(r.Scenarios) > 0
	for i := range r.Scenarios {
		if !r.Scenarios[i].Passed {
			r.Passed = false
		}
	}
}

// FailedChecks returns "scenario: check" for every failed check, and
// "scenario: invalid" or "scenario: error" for scenarios that did not run
// properly.
func (r *Report) FailedChecks() []string {
	var out []string
	for _, s := range r.Scenarios {
		switch {
		case s.Error != "":
			out = append(out, s.Name+": error")
		case !s.Valid:
			out = append(out, s.Name+": invalid")
		}
		for _, c := range s.Failed {
			out = append(out, s.Name+": "+c)
		}
	}
	return out
}

// Write writes report.json and report.html into dir.
func (r *Report) Write(dir string) error {
	if err := writeJSON(filepath.Join(dir, "report.json"), r); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.html"))
	if err != nil {
		return fmt.Errorf("chaos: write report.html: %w", err)
	}
	if err := r.WriteHTML(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("chaos: write report.html: %w", err)
	}
	return nil
}

// Summary writes a terminal summary: per scenario its verdict, calls and
// faults, and each failed check with its first counter-examples.
func (r *Report) Summary(w io.Writer) {
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	for _, s := range r.Scenarios {
		fmt.Fprintf(w, "%s  %-28s %5d calls %5d keys  %2d fault(s)  warm-up %.0f/s", verdict(s.Passed), s.Name, s.Ops+s.SidecarCalls+s.GRPCCalls, s.Keys, len(s.Faults), s.WarmupRate)
		if s.GRPCCalls > 0 {
			fmt.Fprintf(w, "  (%d over gRPC)", s.GRPCCalls)
		}
		if s.SidecarCalls > 0 {
			fmt.Fprintf(w, "  (%d through the sidecar)", s.SidecarCalls)
		}
		if s.Elapsed != "" {
			fmt.Fprintf(w, "  %s", s.Elapsed)
		}
		if s.Redirected > 0 {
			fmt.Fprintf(w, "  %d redirected", s.Redirected)
		}
		fmt.Fprintln(w)
		if s.Error != "" {
			fmt.Fprintf(w, "      error: %s\n", firstLine(s.Error))
		}
		if !s.Valid && s.Error == "" {
			fmt.Fprintf(w, "      INVALID: %s\n", s.Invalid)
		}
		for _, c := range s.Checks {
			if c.Passed && c.Warnings > 0 {
				fmt.Fprintf(w, "      ! %s: %s\n", c.Name, c.Details)
			}
			if c.Passed {
				continue
			}
			fmt.Fprintf(w, "      ✗ %s: %s\n", c.Name, c.Details)
			for i, ce := range c.CounterExamples {
				if i == 3 {
					fmt.Fprintf(w, "          … see the report\n")
					break
				}
				fmt.Fprintf(w, "          %s: %s\n", ce.Key, ce.Summary)
			}
			if c.Visualization != "" {
				fmt.Fprintf(w, "          porcupine: %s\n", filepath.Join(s.Name, c.Visualization))
			}
		}
	}
	fmt.Fprintf(w, "%s: %d scenario(s), seed %d", verdict(r.Passed), len(r.Scenarios), r.Seed)
	if r.Break != "" {
		fmt.Fprintf(w, ", --break %s", r.Break)
	}
	fmt.Fprintln(w)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

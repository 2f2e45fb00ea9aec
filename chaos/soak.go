package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/provider"
)

// Defaults of SoakOptions.
const (
	DefaultSoakDuration   = 10 * time.Minute
	DefaultSoakInterval   = 30 * time.Second
	DefaultSoakFaultEvery = 3 * time.Minute
	// DefaultSoakClients saturate the two cores of the machine the figures
	// of docs/chaos.md ("Soak") come from.
	DefaultSoakClients = 6
	// DefaultSoakWarmup is how much of each process's life (and of the run,
	// for throughput) the growth checks leave out: pools fill, caches warm.
	DefaultSoakWarmup = 3 * time.Minute
	// soakOutboxRetention is the nodes' --outbox-retention (before the
	// soak's own node arguments, which may override it): short, so that
	// the outbox tables reach the size they keep for good, and the
	// pruning its steady pace, before DefaultSoakWarmup ends (idemd's
	// default, a week, would take a week to). The first and the last
	// windows the report compares then both run with the pruning.
	soakOutboxRetention = time.Minute
)

// SoakOptions configures RunSoak.
type SoakOptions struct {
	// Duration is how long the traffic runs. Default DefaultSoakDuration.
	Duration time.Duration
	// Interval is how often the soak samples. Default DefaultSoakInterval.
	Interval time.Duration
	// FaultEvery is the time between the starts of two faults (a node
	// killed and restarted, a node paused, an etcd member or leader
	// killed, the provider failing), the first after half of it.
	// Default DefaultSoakFaultEvery; negative: no faults.
	FaultEvery time.Duration
	// Clients is how many closed-loop clients run. Default
	// DefaultSoakClients.
	Clients int
	// Seed seeds the clients' choices.
	Seed uint64
	// OutDir receives soak.json, soak.html, soak.svg and the cluster's
	// logs. Required.
	OutDir string
	// Regions names the regions (default DefaultRegions()); NodesPerRegion
	// is each one's nodes (default 1, as idemctl up).
	Regions        []string
	NodesPerRegion int
	// StateDir is the cluster's state directory (kept); default: a
	// temporary one, removed afterwards.
	StateDir string
	// NoSidecar runs without the sidecar route and its calls.
	NoSidecar bool
	// NodeArgs are appended to every idemd's command line.
	NodeArgs []string
	// Idemd, Etcd and Idemctl are the binaries (idemctl runs the provider);
	// Idemd is required, the others are found as the cluster finds them.
	Idemd, Etcd, Idemctl string
	// Progress receives a line per sample (nil: none).
	Progress io.Writer
	// Logger receives the cluster's messages. Default: discard.
	Logger *slog.Logger
	// Command is the command line that reproduces the run.
	Command string
}

func (o *SoakOptions) setDefaults() error {
	if o.OutDir == "" {
		return errors.New("chaos: SoakOptions.OutDir is required")
	}
	if o.Idemd == "" {
		return errors.New("chaos: SoakOptions.Idemd is required")
	}
	if o.Duration <= 0 {
		o.Duration = DefaultSoakDuration
	}
	if o.Interval <= 0 {
		o.Interval = DefaultSoakInterval
	}
	if o.FaultEvery == 0 {
		o.FaultEvery = DefaultSoakFaultEvery
	}
	if o.Clients <= 0 {
		o.Clients = DefaultSoakClients
	}
	if len(o.Regions) == 0 {
		o.Regions = DefaultRegions()
	}
	if o.NodesPerRegion <= 0 {
		o.NodesPerRegion = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// SoakCheck is one verdict of a soak.
type SoakCheck struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	Detail string `json:"detail"`
}

// SoakReport is what a soak found; soak.json holds it.
type SoakReport struct {
	Version        int                   `json:"version"`
	Command        string                `json:"command,omitempty"`
	Started        time.Time             `json:"started"`
	Duration       string                `json:"duration"`
	TrafficSeconds float64               `json:"trafficSeconds"`
	Interval       string                `json:"interval"`
	FaultEvery     string                `json:"faultEvery"`
	Clients        int                   `json:"clients"`
	Seed           uint64                `json:"seed"`
	Regions        []string              `json:"regions"`
	NodesPerRegion int                   `json:"nodesPerRegion"`
	Cores          int                   `json:"cores"`
	Counts         map[string]SoakCounts `json:"counts"`
	Wrong          map[string][]string   `json:"wrongExamples,omitempty"`
	Calls          int64                 `json:"calls"`
	Samples        []SoakSample          `json:"samples"`
	Faults         []FaultEvent          `json:"faults"`
	Throughput     DriftResult           `json:"throughput"`
	P99            DriftResult           `json:"p99"`
	Growth         []GrowthResult        `json:"growth"`
	Checks         []SoakCheck           `json:"checks"`
	Passed         bool                  `json:"passed"`
	Error          string                `json:"error,omitempty"`
	Elapsed        string                `json:"elapsed"`
}

// soakFaults returns the faults a soak cycles through, for its regions.
func soakFaults(env *Env, regions []string, etcdMembers int) []Step {
	var steps []Step
	for i, r := range regions {
		steps = append(steps,
			Step{Fault: KillNode(r, 0), Hold: 3 * time.Second},
			Step{Fault: ProviderFault(env, provider.Fault{Mode: provider.FaultFail}), Hold: 5 * time.Second},
			Step{Fault: PauseNode(regions[(i+1)%len(regions)], 0), Hold: 4 * time.Second},
			Step{Fault: KillEtcdMember(i % max(etcdMembers, 1)), Hold: 5 * time.Second},
		)
	}
	return append(steps, Step{Fault: KillEtcdLeader(), Hold: 5 * time.Second})
}

// RunSoak starts a cluster shaped as idemctl up's (three regions of one
// node, three etcd members, the provider simulator, a database per region,
// the sidecar route of the chaos harness's upstream), runs mixed traffic
// against it for opts.Duration with a fault every opts.FaultEvery, samples
// every opts.Interval, and writes soak.json, soak.html and soak.svg into
// opts.OutDir. The error is about the harness (a cluster that does not
// start); checks that fail show in the report (SoakReport.Passed).
func RunSoak(ctx context.Context, opts SoakOptions) (*SoakReport, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: output directory: %w", err)
	}
	began := time.Now()
	rep := &SoakReport{Version: 1, Command: opts.Command, Started: began.UTC(), Duration: opts.Duration.String(),
		Interval: opts.Interval.String(), FaultEvery: opts.FaultEvery.String(), Clients: opts.Clients, Seed: opts.Seed,
		Regions: opts.Regions, NodesPerRegion: opts.NodesPerRegion, Cores: cores()}
	if opts.FaultEvery < 0 {
		rep.FaultEvery = "none"
	}
	err := runSoak(ctx, opts, rep)
	if err != nil {
		rep.Error = err.Error()
	}
	rep.Elapsed = time.Since(began).Round(time.Second).String()
	rep.judge()
	if werr := rep.Write(opts.OutDir); werr != nil {
		return rep, errors.Join(err, werr)
	}
	return rep, err
}

func runSoak(ctx context.Context, opts SoakOptions, rep *SoakReport) error {
	tenants := make([]string, len(opts.Regions))
	for i := range opts.Regions {
		tenants[i] = "tenant-" + string(rune('a'+i))
	}
	cfg := cluster.Config{
		StateDir: opts.StateDir, Regions: opts.Regions, NodesPerRegion: opts.NodesPerRegion, IdemdPath: opts.Idemd,
		EtcdMembers: 3, EtcdPath: opts.Etcd, Provider: true, IdemctlPath: opts.Idemctl, Tenants: tenants,
		ExtraNodeArgs: append([]string{"--outbox-retention", soakOutboxRetention.String()}, opts.NodeArgs...), Logger: opts.Logger,
	}
	var up *sidecarUpstream
	if !opts.NoSidecar {
		var err error
		if up, err = startSidecarUpstream(); err != nil {
			return err
		}
		defer up.close()
		cfg.ProxyRoutes = up.routes()
	}
	c, _, err := startCluster(ctx, cfg, opts.Logger)
	if err != nil {
		return err
	}
	defer func() {
		copyLogs(filepath.Join(c.StateDir(), "logs"), filepath.Join(opts.OutDir, "logs"))
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			opts.Logger.Warn("chaos: stop cluster", "err", err)
		}
	}()
	info := c.Info()
	env := &Env{Cluster: c, LeaseTTL: cluster.DefaultRegionLeaseTTL, log: opts.Logger, sidecar: up}
	if info.ProviderURL != "" {
		env.Provider = providerClient(info.ProviderURL, info.ProviderAdminKey, c.ClientTLS())
	}
	targets := map[string][]target{}
	for _, r := range info.Regions {
		for i, u := range r.Nodes {
			targets[r.Name] = append(targets[r.Name], target{region: r.Name, node: fmt.Sprintf("%s-%d", r.Name, i), url: u})
		}
	}
	runID := fmt.Sprintf("soak%d-%d", opts.Seed, time.Now().Unix())
	tr := newSoakTraffic(runID, opts.Seed, opts.Regions, targets, info.Tokens, info.Placements, c.ClientTLS(), up != nil)
	sampler := newSoakSampler(c)
	defer sampler.close()

	start := time.Now()
	trafficCtx, stopTraffic := context.WithTimeout(ctx, opts.Duration)
	defer stopTraffic()
	var wg sync.WaitGroup
	wg.Go(func() { tr.run(trafficCtx, opts.Clients) })

	// Faults, one every FaultEvery, from half of it (and half an interval,
	// so that no sample falls on a fault's start) until the traffic stops.
	var (
		faultMu sync.Mutex
		active  string
		during  = map[string]bool{} // faults active at some point of the current interval
	)
	if opts.FaultEvery > 0 {
		steps := soakFaults(env, opts.Regions, len(c.EtcdMembers()))
		p := newProgress(nil, false, "soak", opts.Duration)
		wg.Go(func() {
			next := opts.FaultEvery/2 + opts.Interval/2
			for i := 0; ; i++ {
				if sleepUntil(trafficCtx, start.Add(next)) != nil {
					return
				}
				st := steps[i%len(steps)]
				faultMu.Lock()
				active = st.Fault.Name()
				during[active] = true
				faultMu.Unlock()
				ev := runStep(trafficCtx, c, st, start, p)
				faultMu.Lock()
				active = ""
				rep.Faults = append(rep.Faults, ev)
				faultMu.Unlock()
				next += opts.FaultEvery
			}
		})
	}

	// Samples, one per interval.
	for i := 1; ; i++ {
		at := start.Add(time.Duration(i) * opts.Interval)
		last := false
		if end := start.Add(opts.Duration); !at.Before(end) {
			at, last = end, true
		}
		if err := sleepUntil(ctx, at); err != nil {
			break
		}
		iv := tr.take()
		s := SoakSample{T: time.Since(start).Seconds(), Calls: iv.calls, Errors: iv.errors, Wrong: iv.wrong, ByKind: iv.byKind,
			P50ms: percentile(iv.latencies, 0.5), P99ms: percentile(iv.latencies, 0.99)}
		prevT := 0.0
		if n := len(rep.Samples); n > 0 {
			prevT = rep.Samples[n-1].T
		}
		s.Seconds = s.T - prevT
		if s.Seconds > 0 {
			s.Rate = float64(s.Calls-s.Errors) / s.Seconds
		}
		faultMu.Lock()
		var names []string
		for n := range during {
			names = append(names, n)
		}
		clear(during)
		if active != "" {
			during[active] = true
		}
		faultMu.Unlock()
		sort.Strings(names)
		s.Fault = strings.Join(names, ", ")
		sctx, cancel := context.WithTimeout(ctx, opts.Interval/2)
		sampler.sample(sctx, &s)
		cancel()
		rep.Samples = append(rep.Samples, s)
		// Written at every sample, so that an interrupted soak keeps what
		// it measured.
		faultMu.Lock() // rep.Faults
		if err := writeJSON(filepath.Join(opts.OutDir, "soak.json"), rep); err != nil {
			opts.Logger.Warn("chaos: soak", "err", err)
		}
		faultMu.Unlock()
		if opts.Progress != nil {
			fmt.Fprintln(opts.Progress, progressLine(s))
		}
		if last {
			break
		}
	}
	stopTraffic()
	wg.Wait()
	rep.TrafficSeconds = time.Since(start).Seconds()
	rep.Counts, rep.Wrong = tr.totals()
	for _, n := range rep.Counts {
		rep.Calls += n.Calls
	}
	return ctx.Err()
}

// sleepUntil waits for t or ctx's end.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// progressLine is one sample in a line.
func progressLine(s SoakSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak %5.0fs: %6.1f calls/s p50 %.1fms p99 %.1fms errors %d wrong %d", s.T, s.Rate, s.P50ms, s.P99ms, s.Errors, s.Wrong)
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, " | %s %.1fMB g%.0f fd%.0f pool%.0f", n.Name, n.RSSBytes/(1<<20), n.Goroutines, n.OpenFDs, n.PoolTotal)
	}
	var db int64
	for _, st := range s.Stores {
		db += st.DatabaseBytes
	}
	fmt.Fprintf(&b, " | db %.0fMB", float64(db)/(1<<20))
	if s.Provider != nil {
		fmt.Fprintf(&b, " provider %.0fMB rss %.0fMB", float64(s.Provider.DataBytes)/(1<<20), float64(s.Provider.RSSBytes)/(1<<20))
	}
	if s.Fault != "" {
		fmt.Fprintf(&b, " [%s]", s.Fault)
	}
	if s.Load != "" {
		fmt.Fprintf(&b, " load %s", s.Load)
	}
	return b.String()
}

// cores returns the number of CPUs this process may use.
func cores() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

// Series extraction for the checks and the plots.

// rateSeries returns the throughput per sample.
func (r *SoakReport) series(get func(SoakSample) float64) []Point {
	out := make([]Point, 0, len(r.Samples))
	for _, s := range r.Samples {
		out = append(out, Point{T: s.T, V: get(s)})
	}
	return out
}

// nodeNames lists the nodes sampled, in order of first appearance.
func (r *SoakReport) nodeNames() []string {
	var names []string
	seen := map[string]bool{}
	for _, s := range r.Samples {
		for _, n := range s.Nodes {
			if !seen[n.Name] {
				seen[n.Name] = true
				names = append(names, n.Name)
			}
		}
	}
	return names
}

// nodeSeries returns one node's series of a metric and its start times.
func (r *SoakReport) nodeSeries(name string, get func(NodeSample) float64) ([]Point, []float64) {
	var pts []Point
	var starts []float64
	for _, s := range r.Samples {
		for _, n := range s.Nodes {
			if n.Name == name {
				pts = append(pts, Point{T: s.T, V: get(n)})
				starts = append(starts, n.StartTime)
			}
		}
	}
	return pts, starts
}

// soakResources are the node metrics whose growth must level off, with the
// absolute growth each may show regardless of its level.
var soakResources = []struct {
	name  string
	get   func(NodeSample) float64
	slack float64
}{
	{"rss", func(n NodeSample) float64 { return n.RSSBytes }, 8 << 20},
	{"goroutines", func(n NodeSample) float64 { return n.Goroutines }, 10},
	{"fds", func(n NodeSample) float64 { return n.OpenFDs }, 10},
}

// soakBacklogSlack is how many rows a region's outbox backlog may grow by
// over a run regardless of its level: a few batches.
const soakBacklogSlack = 1000

// judge computes the checks from the samples.
func (r *SoakReport) judge() {
	end := r.TrafficSeconds
	if n := len(r.Samples); n > 0 {
		end = r.Samples[n-1].T
	}
	window := SoakWindow(time.Duration(end * float64(time.Second))).Round(time.Second)
	r.Checks = nil
	r.Throughput = ThroughputDrift(r.series(func(s SoakSample) float64 { return s.Rate }), end, window)
	r.Checks = append(r.Checks, SoakCheck{Name: "throughput-steady", Passed: r.Throughput.Passed, Detail: r.Throughput.Detail + "; " + r.Throughput.Bound})
	r.P99 = P99Drift(r.series(func(s SoakSample) float64 { return s.P99ms }), end, window)
	r.Checks = append(r.Checks, SoakCheck{Name: "p99-steady", Passed: r.P99.Passed, Detail: r.P99.Detail + "; " + r.P99.Bound})
	r.Growth = nil
	warmup := min(DefaultSoakWarmup.Seconds(), end/10)
	for _, res := range soakResources {
		check := SoakCheck{Name: res.name + "-levels-off", Passed: true}
		var details []string
		judged := 0
		for _, name := range r.nodeNames() {
			pts, starts := r.nodeSeries(name, res.get)
			// A stretch shorter than a third of the run projects a fault's
			// few goroutines or descriptors over the whole run.
			g := LevelsOff(name+" "+res.name, pts, starts, end, warmup, max(window.Seconds(), end/3), res.slack)
			r.Growth = append(r.Growth, g)
			if g.Judged {
				judged++
				if !g.Passed {
					check.Passed = false
					details = append(details, fmt.Sprintf("%s grows: %s", name, g.Detail))
				}
			}
		}
		switch {
		case judged == 0:
			check.Passed = false
			details = append(details, "no node ran long enough without a restart to judge")
		case check.Passed:
			details = append(details, fmt.Sprintf("%d nodes level off", judged))
		}
		check.Detail = strings.Join(details, "; ")
		r.Checks = append(r.Checks, check)
	}
	// Work the outbox has not done yet (events to publish, deliveries to
	// consume, receipts to send), per region: it must level off, or the
	// outbox falls further behind the traffic for as long as it runs.
	bc := SoakCheck{Name: "backlog-levels-off", Passed: true}
	var bdetails []string
	for _, region := range r.Regions {
		var pts []Point
		var starts []float64
		for _, s := range r.Samples {
			for _, st := range s.Stores {
				if st.Region == region {
					pts = append(pts, Point{T: s.T, V: float64(st.OutboxBacklog + st.QueuePending + st.EmailsUnsent)})
					starts = append(starts, 1)
				}
			}
		}
		g := LevelsOff(region+" backlog", pts, starts, end, warmup, max(window.Seconds(), end/3), soakBacklogSlack)
		r.Growth = append(r.Growth, g)
		if g.Judged && !g.Passed {
			bc.Passed = false
			bdetails = append(bdetails, fmt.Sprintf("%s grows: %s", region, g.Detail))
		}
		if !g.Judged {
			bc.Passed = false
			bdetails = append(bdetails, region+": "+g.Detail)
		}
	}
	if bc.Passed {
		bdetails = append(bdetails, fmt.Sprintf("%d regions level off", len(r.Regions)))
	}
	bc.Detail = strings.Join(bdetails, "; ")
	r.Checks = append(r.Checks, bc)

	var wrong int64
	var ex []string
	for _, k := range SoakKinds() {
		wrong += r.Counts[k].Wrong
		ex = append(ex, r.Wrong[k]...)
	}
	ac := SoakCheck{Name: "answers-as-contracted", Passed: wrong == 0 && r.Calls > 0,
		Detail: fmt.Sprintf("%d calls, %d answers against the contract", r.Calls, wrong)}
	if len(ex) > 0 {
		ac.Detail += ": " + strings.Join(ex, "; ")
	}
	r.Checks = append(r.Checks, ac)
	r.Passed = r.Error == ""
	for _, c := range r.Checks {
		r.Passed = r.Passed && c.Passed
	}
}

// ReadSoakReport reads a soak.json that RunSoak wrote (at the end of a run
// or, for an interrupted one, after its last sample) and judges its samples
// again with this build's checks, so that its report can be written anew.
func ReadSoakReport(path string) (*SoakReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: read soak report: %w", err)
	}
	var r SoakReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("chaos: decode %s: %w", filepath.Base(path), err)
	}
	if r.TrafficSeconds == 0 && len(r.Samples) > 0 {
		r.TrafficSeconds = r.Samples[len(r.Samples)-1].T
	}
	r.judge()
	return &r, nil
}

// Write writes soak.json, soak.html and soak.svg into dir.
func (r *SoakReport) Write(dir string) error {
	if err := writeJSON(filepath.Join(dir, "soak.json"), r); err != nil {
		return err
	}
	var b strings.Builder
	if err := r.WriteHTML(&b); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.html"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("chaos: write soak.html: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(r.SVG()), 0o644); err != nil {
		return fmt.Errorf("chaos: write soak.svg: %w", err)
	}
	return nil
}

// Summary prints the verdicts and the figures a reader looks for first.
func (r *SoakReport) Summary(w io.Writer) {
	verdict := "PASS"
	if !r.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "soak %s: %s of traffic, %d calls, %d clients, faults every %s (%d injected)\n",
		verdict, time.Duration(r.TrafficSeconds*float64(time.Second)).Round(time.Second), r.Calls, r.Clients, r.FaultEvery, len(r.Faults))
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
	for _, k := range SoakKinds() {
		c := r.Counts[k]
		if c.Calls > 0 {
			fmt.Fprintf(w, "  %-15s %8d calls, %d errors, %d wrong\n", k, c.Calls, c.Errors, c.Wrong)
		}
	}
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.Passed {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-22s %s\n", mark, c.Name, c.Detail)
	}
	if len(r.Samples) == 0 {
		return
	}
	first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
	fmt.Fprintf(w, "  %-12s %12s %12s\n", "", fmt.Sprintf("t=%.0fs", first.T), fmt.Sprintf("t=%.0fs", last.T))
	for i := range last.Nodes {
		ln := last.Nodes[i]
		var fn NodeSample // its first sample while it ran
	first:
		for _, s := range r.Samples {
			for _, n := range s.Nodes {
				if n.Name == ln.Name && n.StartTime != 0 {
					fn = n
					break first
				}
			}
		}
		fmt.Fprintf(w, "  %-12s rss %6.1f MB -> %6.1f MB, goroutines %4.0f -> %4.0f, fds %3.0f -> %3.0f, pool %2.0f -> %2.0f\n",
			ln.Name, fn.RSSBytes/(1<<20), ln.RSSBytes/(1<<20), fn.Goroutines, ln.Goroutines, fn.OpenFDs, ln.OpenFDs, fn.PoolTotal, ln.PoolTotal)
	}
	if first.Postgres != nil && last.Postgres != nil {
		fmt.Fprintf(w, "  postgres     data %.0f MB -> %.0f MB, checkpoints %d -> %d\n", float64(first.Postgres.DataBytes)/(1<<20),
			float64(last.Postgres.DataBytes)/(1<<20), first.Postgres.CheckpointsTimed+first.Postgres.CheckpointsReq,
			last.Postgres.CheckpointsTimed+last.Postgres.CheckpointsReq)
	}
	if first.Provider != nil && last.Provider != nil {
		fmt.Fprintf(w, "  provider     data %.1f MB -> %.1f MB, rss %.1f MB -> %.1f MB\n", float64(first.Provider.DataBytes)/(1<<20),
			float64(last.Provider.DataBytes)/(1<<20), float64(first.Provider.RSSBytes)/(1<<20), float64(last.Provider.RSSBytes)/(1<<20))
	}
}

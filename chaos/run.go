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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/internal/ctxtime"
	"github.com/idemcoord/idem/provider"
)

// Defaults of Options.
const (
	DefaultDuration   = 30 * time.Second
	DefaultClients    = 12
	DefaultMinRate    = 5.0
	DefaultStuckBound = 30 * time.Second
	// DefaultDrain bounds how long open operations keep retrying after the
	// traffic stops.
	DefaultDrain = 15 * time.Second
)

// DefaultRegions returns the default region names, in order; a scenario
// uses as many as it needs.
func DefaultRegions() []string { return []string{"eu-west", "us-east", "ap-south"} }

// Options configures Run.
type Options struct {
	// Scenario is a catalogue name, several separated by commas, or
	// "all".
	Scenario string
	// Duration is how long each scenario's traffic runs, faults included
	// (it runs longer when its faults need more). Default DefaultDuration.
	Duration time.Duration
	// Seed seeds every random choice of the workload.
	Seed uint64
	// OutDir receives report.json, report.html and, per scenario,
	// <scenario>/ with the history, porcupine's visualisation and the
	// cluster's logs. Required.
	OutDir string
	// Clients is how many concurrent clients run. Default DefaultClients.
	Clients int
	// Regions names the regions (default DefaultRegions()); a scenario uses
	// the first Scenario.Regions of them (2 unless it says otherwise), or
	// all of them when fewer are given.
	Regions []string
	// NodesPerRegion overrides the scenarios' nodes per region.
	NodesPerRegion int
	// Break is passed to every idemd as --break (a deliberately broken
	// engine that the run must catch). Default: none.
	Break string
	// MinRate is the minimum rate (completed calls per second) before the
	// first fault; below it the run is invalid. Default DefaultMinRate.
	MinRate float64
	// StuckBound is how long after the traffic stops every open record
	// and backlog must have settled. Default DefaultStuckBound.
	StuckBound time.Duration
	// Idemd, Etcd and Idemctl are the binaries (idemctl runs the provider).
	// Idemd must be built with -tags failpoints (BuildCommand): the faults
	// and broken engines are compiled in only then.
	Idemd, Etcd, Idemctl string
	// Progress receives a progress line while a scenario runs (nil: none);
	// ProgressTTY rewrites one line with \r instead of printing lines.
	Progress    io.Writer
	ProgressTTY bool
	// Logger receives the cluster's and the harness's messages. Default:
	// discard.
	Logger *slog.Logger
	// Command is the command line that reproduces the run, for the report.
	Command string
	// Env is where the clusters run: EnvProcess (default) or EnvDocker.
	Env string
	// TLS runs every scenario's cluster with TLS on every link
	// (cluster.Config.TLS): nodes forward over mutual TLS through the
	// links' TCP proxies, etcd requires client certificates, the provider
	// serves HTTPS. Default false.
	TLS bool
}

func (o *Options) setDefaults() error {
	if o.OutDir == "" {
		return errors.New("chaos: Options.OutDir is required")
	}
	if o.Duration <= 0 {
		o.Duration = DefaultDuration
	}
	if o.Clients <= 0 {
		o.Clients = DefaultClients
	}
	if len(o.Regions) == 0 {
		o.Regions = DefaultRegions()
	}
	if o.MinRate <= 0 {
		o.MinRate = DefaultMinRate
	}
	if o.StuckBound <= 0 {
		o.StuckBound = DefaultStuckBound
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Env == "" {
		o.Env = EnvProcess
	}
	if !slices.Contains(Envs(), o.Env) {
		return fmt.Errorf("chaos: unknown environment %q (have: %s)", o.Env, strings.Join(Envs(), ", "))
	}
	if o.Env == EnvDocker && o.TLS {
		return errors.New("chaos: the docker environment does not run with TLS yet")
	}
	if o.Break != "" && !slices.Contains(BreakModes(), o.Break) {
		return fmt.Errorf("chaos: unknown break mode %q", o.Break)
	}
	if o.Idemd == "" {
		return errors.New("chaos: Options.Idemd is required")
	}
	// Absolute: the nodes' wrapper execs it, in containers too.
	abs, err := filepath.Abs(o.Idemd)
	if err != nil {
		return fmt.Errorf("chaos: idemd binary: %w", err)
	}
	o.Idemd = abs
	for what, path := range map[string]string{"idemd": o.Idemd, "etcd": o.Etcd, "idemctl": o.Idemctl} {
		if path == "" && what != "idemd" {
			continue // the cluster finds it
		}
		if fi, err := os.Stat(path); err != nil {
			return fmt.Errorf("chaos: %s binary: %w", what, err)
		} else if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("chaos: %s binary %s is not an executable file", what, path)
		}
	}
	return RequireFailpoints(o.Idemd)
}

// Run runs the scenario (or every scenario) named by opts.Scenario, each on
// a cluster of its own, and writes report.json and report.html into
// opts.OutDir. The error is about the harness itself (a cluster that does
// not start, an unwritable directory); a scenario whose checks fail or
// whose traffic was too thin shows in the report (Report.Passed).
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	var scenarios []Scenario
	if opts.Scenario == "all" {
		for _, s := range Catalogue() {
			if ok, _ := s.RunsIn(opts.Env); ok && (!opts.TLS || !s.PgBouncer) {
				scenarios = append(scenarios, s)
			}
		}
	} else {
		for _, name := range strings.Split(opts.Scenario, ",") {
			s, err := Lookup(strings.TrimSpace(name))
			if err != nil {
				return nil, err
			}
			if ok, why := s.RunsIn(opts.Env); !ok {
				return nil, fmt.Errorf("chaos: scenario %s does not run in the %s environment: %s", s.Name, opts.Env, why)
			}
			if opts.TLS && s.PgBouncer {
				return nil, fmt.Errorf("chaos: scenario %s does not run with TLS: the local PgBouncer does not terminate the nodes' TLS", s.Name)
			}
			scenarios = append(scenarios, s)
		}
	}
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: output directory: %w", err)
	}
	rep := &Report{
		Version: 1, Scenario: opts.Scenario, Env: opts.Env, Seed: opts.Seed, Break: opts.Break, Started: time.Now().UTC(),
		Duration: opts.Duration.String(), Clients: opts.Clients, MinRate: opts.MinRate, Command: opts.Command,
	}
	var errs []error
	for _, s := range scenarios {
		if ctx.Err() != nil {
			break
		}
		sr, err := runScenario(ctx, s, opts)
		if err != nil {
			errs = append(errs, fmt.Errorf("scenario %s: %w", s.Name, err))
			if sr == nil {
				sr = &ScenarioReport{Name: s.Name, Description: s.Description}
			}
			sr.Error = err.Error()
			sr.verdict()
		}
		rep.Scenarios = append(rep.Scenarios, *sr)
		// Write after every scenario, so that an interrupted "all" keeps
		// what it found.
		rep.finish()
		if werr := rep.Write(opts.OutDir); werr != nil {
			return rep, werr
		}
	}
	rep.finish()
	if err := rep.Write(opts.OutDir); err != nil {
		return rep, err
	}
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	return rep, ctx.Err()
}

// runID names a scenario's keys and merchant references.
func runID(s Scenario, seed uint64) string {
	return fmt.Sprintf("s%d-%s", seed, s.Name)
}

// startCluster starts a cluster, retrying a start that fails (a port taken
// by another process between its choice and its use), and returns the
// errors of the failed attempts.
func startCluster(ctx context.Context, cfg cluster.Config, log *slog.Logger) (*cluster.Cluster, []error, error) {
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := cluster.Start(ctx, cfg)
		if err == nil {
			return c, errs, nil
		}
		log.Warn("chaos: cluster start failed", "attempt", attempt, "err", err)
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errs, fmt.Errorf("chaos: start cluster: %w", errors.Join(errs...))
}

// runScenario runs one scenario on a new cluster.
func runScenario(ctx context.Context, s Scenario, opts Options) (*ScenarioReport, error) {
	began := time.Now()
	dir := filepath.Join(opts.OutDir, s.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: scenario directory: %w", err)
	}
	work, err := os.MkdirTemp("", "idem-chaos-")
	if err != nil {
		return nil, fmt.Errorf("chaos: work directory: %w", err)
	}
	defer os.RemoveAll(work)
	nodes, err := newNodeControl(work, opts.Idemd)
	if err != nil {
		return nil, err
	}

	nRegions := max(s.Regions, 2)
	regions := opts.Regions
	if len(regions) > nRegions {
		regions = regions[:nRegions]
	}
	perRegion := s.NodesPerRegion
	if perRegion == 0 {
		perRegion = 2
	}
	if opts.NodesPerRegion > 0 {
		perRegion = opts.NodesPerRegion
	}
	storeMode := s.StoreMode
	if storeMode == "" {
		storeMode = cluster.StoreRegionLocal
	}
	tenants := make([]string, len(regions))
	for i := range regions {
		tenants[i] = "tenant-" + string(rune('a'+i))
	}
	args := slices.Concat(baseNodeArgs, s.NodeArgs)
	if opts.Break != "" {
		args = append(args, "--break", opts.Break)
	}
	sr := &ScenarioReport{
		Name: s.Name, Description: s.Description, Seed: opts.Seed, Break: opts.Break,
		Regions: regions, NodesPerRegion: perRegion, StoreMode: storeMode, Direct: s.Direct, StoreLinksOnly: s.StoreLinksOnly, PgBouncer: s.PgBouncer, Clients: opts.Clients + s.ExtraClients,
		Started: began.UTC(), MinRate: opts.MinRate, NodeArgs: args,
	}
	cfg := cluster.Config{
		Regions: regions, NodesPerRegion: perRegion, IdemdPath: nodes.wrapper,
		EtcdMembers: 3, EtcdPath: opts.Etcd, Provider: true, IdemctlPath: opts.Idemctl, StoreMode: storeMode, StoreHA: s.StoreHA,
		RegionLeaseTTL: chaosLeaseTTL, StoreHATTL: chaosStoreTTL, Proxied: !s.Direct, ProxiedStoreOnly: s.StoreLinksOnly, PgBouncer: s.PgBouncer, Tenants: tenants, ReplayWindow: s.ReplayWindow,
		ExtraNodeArgs: args, Logger: opts.Logger, TLS: opts.TLS,
	}
	if opts.Env == EnvDocker {
		// The nodes run the wrapper, which reads its overrides and execs
		// idemd: all three are mounted into the containers.
		cfg.Docker = true
		cfg.DockerMounts = []string{nodes.dir, nodes.wrapper, opts.Idemd}
	}
	var up *sidecarUpstream
	if s.Sidecar {
		if up, err = startSidecarUpstream(); err != nil {
			return sr, err
		}
		defer up.close()
		cfg.ProxyRoutes = up.routes()
	}
	progress := newProgress(opts.Progress, opts.ProgressTTY, s.Name, opts.Duration)
	defer progress.stop()
	progress.setPhase("starting cluster")
	c, failedStarts, err := startCluster(ctx, cfg, opts.Logger)
	for _, e := range failedStarts {
		sr.StartRetries = append(sr.StartRetries, firstLine(e.Error()))
	}
	if err != nil {
		return sr, err
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		copyLogs(filepath.Join(c.StateDir(), "logs"), filepath.Join(dir, "logs"))
		if st := c.Store(); st != nil {
			// Each replicated store member's Patroni and PostgreSQL log,
			// as <member>.log: what the store did during its failover.
			for _, m := range st.Members() {
				copyFile(m.LogPath(), filepath.Join(dir, "logs", m.Name+".log"))
			}
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			opts.Logger.Warn("chaos: stop cluster", "err", err)
		}
	}
	defer stop()

	info := c.Info()
	env := &Env{Cluster: c, LeaseTTL: chaosLeaseTTL, nodes: nodes, log: opts.Logger, sidecar: up}
	if s.GRPC {
		if opts.Idemctl == "" {
			return sr, errGRPCNoNodes
		}
		progress.setPhase("starting gRPC nodes")
		g, err := startGRPCNodes(ctx, opts.Idemctl, info.DatabaseURL, filepath.Join(dir, "logs"))
		if err != nil {
			return sr, err
		}
		defer g.stop()
		env.grpc = g
		env.grpcTraffic = newGRPCTraffic(g, runID(s, opts.Seed), opts.Seed)
	}
	if info.ProviderURL != "" {
		env.Provider = providerClient(info.ProviderURL, info.ProviderAdminKey, c.ClientTLS())
	}
	if s.IdleTenants > 0 {
		progress.setPhase("placing idle tenants")
		if c.EtcdClient() == nil {
			return sr, fmt.Errorf("chaos: %s needs etcd for its idle tenants", s.Name)
		}
		if err := placeIdleTenants(ctx, c.EtcdClient(), regions[0], s.IdleTenants); err != nil {
			return sr, err
		}
		sr.IdleTenants = s.IdleTenants
	}
	targets := map[string][]target{}
	for _, r := range info.Regions {
		for i, u := range r.Nodes {
			targets[r.Name] = append(targets[r.Name], target{region: r.Name, node: fmt.Sprintf("%s-%d", r.Name, i), url: u})
		}
	}
	hist := &History{}
	wcfg := s.Workload
	wcfg.Clients = opts.Clients + s.ExtraClients
	wcfg.ReplayWindow = s.ReplayWindow
	wcfg.TLS = c.ClientTLS()
	if s.ReplayWindow > 0 && s.ReplayWindow < time.Minute {
		wcfg.GiveUpAfter = s.ReplayWindow / 2
	}
	if wcfg.Mix == nil {
		wcfg.Mix = map[Role]int{RoleNormal: 1}
	}
	start := time.Now()
	w := newWorkload(wcfg, opts.Seed, runID(s, opts.Seed), regions, targets, info.Tokens, info.Placements, hist, start)
	progress.attach(w, start)

	var steps []Step
	if s.Faults != nil {
		steps = s.Faults(env, regions)
	}

	// Traffic.
	trafficCtx, drainCtx, stopTraffic, stopDrain := startTraffic(ctx)
	defer stopTraffic()
	defer stopDrain()
	var wg sync.WaitGroup
	wg.Go(func() { w.run(trafficCtx, drainCtx) })
	var sct *sidecarTraffic
	if up != nil {
		sct = newSidecarTraffic(up, s.SidecarForm, runID(s, opts.Seed), opts.Seed, regions, targets, info.Tokens, c.ClientTLS())
		wg.Go(func() { sct.run(trafficCtx, drainCtx, opts.Clients) })
	}
	if gt := env.grpcTraffic; gt != nil {
		wg.Go(func() { gt.run(trafficCtx, drainCtx, opts.Clients) })
	}

	// Warm-up: the traffic must reach the minimum rate before any fault.
	warmup := min(max(opts.Duration/5, 2*time.Second), 8*time.Second)
	progress.setPhase("warm-up")
	sleepCtx(ctx, warmup)
	sr.WarmupRate = float64(countEnded(hist.Ops(), 0, time.Since(start))) / time.Since(start).Seconds()
	sr.Valid = sr.WarmupRate >= opts.MinRate
	if !sr.Valid {
		sr.Invalid = fmt.Sprintf("traffic before the first fault was %.1f calls/s, below the minimum %.1f/s", sr.WarmupRate, opts.MinRate)
	}

	// Faults, one after the other.
	for i, st := range steps {
		if !sr.Valid || ctx.Err() != nil {
			break
		}
		ev := runStepIn(ctx, c, env, st, start, progress)
		sr.Faults = append(sr.Faults, ev)
		if i < len(steps)-1 {
			sleepCtx(ctx, time.Second)
		}
	}
	// The rest of the duration, and at least a short tail after the last
	// heal.
	progress.setPhase("traffic")
	sleepCtx(ctx, max(opts.Duration-time.Since(start), 2*time.Second))
	stopTraffic()
	progress.setPhase("draining")
	wg.Wait()
	sr.TrafficSeconds = time.Since(start).Seconds()

	// Let recovery and the outbox settle, then resend every answered
	// command once.
	progress.setPhase("quiescing")
	prefix := runID(s, opts.Seed) + "-"
	qctx := context.WithoutCancel(ctx)
	_, quiesced, took, err := quiesce(qctx, viewOf(c), prefix, opts.StuckBound)
	if err != nil {
		return sr, err
	}
	sweepHealth := ""
	if s.ReplayWindow == 0 || s.ReplayWindow > time.Minute {
		// "After the faults healed": every node ready, so its region holds
		// its lease and its map has caught up with the last move. A sweep
		// sent earlier would measure the heal, not the replays.
		progress.setPhase("health before the replay sweep")
		if err := waitHealthy(qctx, c, env, 30*time.Second); err != nil {
			sweepHealth = err.Error()
		}
		progress.setPhase("replay sweep")
		sctx, cancel := context.WithTimeout(qctx, 30*time.Second)
		w.sweep(sctx)
		if sct != nil {
			sct.sweep(sctx)
		}
		if env.grpcTraffic != nil {
			env.grpcTraffic.sweep(sctx)
		}
		cancel()
	}
	progress.setPhase("checking")
	st, _, _, err := quiesce(qctx, viewOf(c), prefix, 5*time.Second)
	if err != nil {
		return sr, err
	}
	homes, err := homeStores(qctx, viewOf(c))
	if err != nil {
		return sr, err
	}
	var charges *provider.ChargeCounts
	if env.Provider != nil {
		cc, err := env.Provider.Charges(qctx)
		if err != nil {
			return sr, fmt.Errorf("chaos: provider charges: %w", err)
		}
		charges = &cc
	}
	ops := hist.Ops()
	var scres *sidecarResult
	if sct != nil {
		scres = sct.result()
		for _, k := range scres.keys {
			sr.SidecarCalls += len(k.Answers)
		}
		if err := writeJSON(filepath.Join(dir, "sidecar.json"), scres.keys); err != nil {
			return sr, err
		}
	}
	var gres *grpcResult
	if gt := env.grpcTraffic; gt != nil {
		if gres, err = gt.result(qctx); err != nil {
			return sr, err
		}
		for _, k := range gres.keys {
			sr.GRPCCalls += len(k.Answers)
		}
		if err := writeJSON(filepath.Join(dir, "grpc.json"), gres.keys); err != nil {
			return sr, err
		}
	}
	sr.Checks = runChecks(&checkInput{
		ops: ops, st: st, homes: homes, charges: charges, quiesced: quiesced, quiesceTook: took,
		stuckBound: opts.StuckBound, reexecute: env.FailedOver(), faults: sr.Faults, outDir: dir,
		linTimeout: time.Minute, sidecar: scres, grpc: gres, sweepHealth: sweepHealth,
	})
	var drillResult CheckResult
	sr.Drills, drillResult = scenarioDrills(steps, sr.Faults, info.Placements, ops, sr.Checks, chaosLeaseTTL)
	if len(sr.Drills) > 0 {
		sr.Drill = sr.Drills[0]
	}
	sr.Checks = withCheck(sr.Checks, drillResult)
	progress.stop()
	sr.summarise(ops)
	if err := writeJSON(filepath.Join(dir, "history.json"), ops); err != nil {
		return sr, err
	}
	sr.History = s.Name + "/history.json"
	sr.Logs = s.Name + "/logs/"
	stop()
	sr.Elapsed = time.Since(began).Round(time.Millisecond).String()
	return sr, nil
}

// startTraffic returns the workload's two contexts: calls are sent until
// stopTraffic (or ctx's end), and calls in flight then drain for at most
// DefaultDrain, until ctx ends or stopDrain is called.
func startTraffic(ctx context.Context) (trafficCtx, drainCtx context.Context, stopTraffic, stopDrain context.CancelFunc) {
	trafficCtx, stopTraffic = context.WithCancel(ctx)
	drainCtx, stopDrain = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-drainCtx.Done():
		case <-trafficCtx.Done():
			select {
			case <-ctx.Done():
			case <-drainCtx.Done():
			case <-time.After(DefaultDrain):
			}
		}
		stopDrain()
	}()
	return trafficCtx, drainCtx, stopTraffic, stopDrain
}

// runStep injects and heals one fault, checking health before and after.
func runStep(ctx context.Context, c *cluster.Cluster, st Step, start time.Time, p *progress) FaultEvent {
	return runStepIn(ctx, c, nil, st, start, p)
}

// runStepIn is runStep in a run whose env may have lost regions for good
// (RegionLost): their nodes are left out of the health checks.
func runStepIn(ctx context.Context, c *cluster.Cluster, env *Env, st Step, start time.Time, p *progress) FaultEvent {
	f := st.Fault
	ev := FaultEvent{Name: f.Name(), Hold: st.Hold.String()}
	if !f.Available(c) {
		ev.Skipped = "not available on this cluster"
		return ev
	}
	p.setPhase("health before " + f.Name())
	if err := waitHealthy(ctx, c, env, 20*time.Second); err != nil {
		ev.PreHealthError = err.Error()
		ev.Skipped = "the cluster was not healthy before the fault"
		return ev
	}
	p.setPhase("fault")
	p.setFault(f.Name())
	ev.At = time.Since(start).Seconds()
	if err := f.Inject(ctx, c); err != nil {
		ev.InjectError = err.Error()
	}
	if ct, ok := f.(interface{ CutAt() time.Time }); ok && !ct.CutAt().IsZero() {
		ev.CutAt = ct.CutAt().Sub(start).Seconds()
	}
	ev.InjectedFor = time.Since(start).Seconds() - ev.At
	sleepCtx(ctx, st.Hold)
	ev.HealAt = time.Since(start).Seconds()
	if err := f.Heal(context.WithoutCancel(ctx), c); err != nil {
		ev.HealError = err.Error()
	}
	ev.HealedAt = time.Since(start).Seconds()
	p.setFault("")
	p.setPhase("health after " + f.Name())
	if err := waitHealthy(context.WithoutCancel(ctx), c, env, 30*time.Second); err != nil {
		ev.PostHealthError = err.Error()
	}
	ev.RecoveredAt = time.Since(start).Seconds()
	if n, ok := f.(Noter); ok {
		ev.Notes = n.Notes()
	}
	return ev
}

func sleepCtx(ctx context.Context, d time.Duration) { _ = ctxtime.Sleep(ctx, d) }

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("chaos: encode %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("chaos: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// copyLogs copies the cluster's log files into dst (best effort).
func copyLogs(src, dst string) {
	ents, err := os.ReadDir(src)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() {
			copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
		}
	}
}

// copyFile copies the file src to dst, creating dst's directory; it does
// nothing if src cannot be read (a log is evidence, not a result).
func copyFile(src, dst string) {
	in, err := os.Open(src)
	if err != nil {
		return
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return
	}
	out, err := os.Create(dst)
	if err == nil {
		_, _ = io.Copy(out, in)
		_ = out.Close()
	}
}

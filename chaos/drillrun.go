package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/failover"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/routing"
)

// DrillOptions configure RunDrill: a failover drill against a cluster that
// is already running (idemctl up, or a staging deployment described the
// same way), where the operator supplies the fault and its heal as
// commands.
type DrillOptions struct {
	// Cluster describes the cluster, as its cluster.json does (required).
	Cluster cluster.Info
	// Region is the region the drill takes down (required).
	Region string
	// Inject and Heal are the operator's commands, run with "sh -c":
	// Inject takes Region down (kills or stops its processes, cuts its
	// network), Heal brings it back ("" or "true" when it stays down).
	Inject, Heal string
	// Failover is FailoverManual (the drill performs the failover, as
	// "idemctl region failover" does, once Region's leases lapsed) or
	// FailoverAuto (the nodes run --auto-failover-after; the drill only
	// waits). Default FailoverManual.
	Failover string
	// To is where a manual failover moves Region's tenants. Default: the
	// first other region of Cluster.
	To string
	// Hold is how long Region stays down after the failover before Heal.
	// Default 2s.
	Hold time.Duration
	// LeaseTTL is the nodes' --region-lease-ttl (the RTO bound is LeaseTTL
	// + RTOSlack). Default cluster.DefaultRegionLeaseTTL.
	LeaseTTL time.Duration
	// Duration, Seed, Clients, MinRate, StuckBound, OutDir, Logger,
	// Progress, ProgressTTY and Command are as in Options.
	Duration    time.Duration
	Seed        uint64
	Clients     int
	MinRate     float64
	StuckBound  time.Duration
	OutDir      string
	Logger      *slog.Logger
	Progress    io.Writer
	ProgressTTY bool
	Command     string
}

// DrillScenario is the name a drill's report gives its scenario.
const DrillScenario = "drill"

// drillWorkload is the traffic of a drill: region-failover's.
var drillWorkload = WorkloadConfig{Mix: map[Role]int{RoleNormal: 2, RoleNoKey: 1}, Replays: 0.3, NoKeyDelay: 4 * time.Second}

// RunDrill runs a failover drill against a running cluster: the chaos
// harness's workload and checks, with the operator's fault. It sends
// traffic to every node, runs Inject after the warm-up, performs (manual)
// or waits for (auto) the failover of Region, holds, runs Heal, hands
// Region's records of the moved tenants over to their new home once its
// store answers, lets the traffic run to Duration, and checks the history
// and the stores like a chaos scenario. It writes report.json and
// report.html (with the drill figures) into OutDir.
func RunDrill(ctx context.Context, opts DrillOptions) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(opts.OutDir, DrillScenario), 0o755); err != nil {
		return nil, fmt.Errorf("chaos: output directory: %w", err)
	}
	rep := &Report{
		Version: 1, Scenario: DrillScenario, Seed: opts.Seed, Started: time.Now().UTC(),
		Duration: opts.Duration.String(), Clients: opts.Clients, MinRate: opts.MinRate, Command: opts.Command,
	}
	sr, err := runDrill(ctx, opts)
	if err != nil {
		if sr == nil {
			sr = &ScenarioReport{Name: DrillScenario}
		}
		sr.Error = err.Error()
		sr.verdict()
	}
	rep.Scenarios = []ScenarioReport{*sr}
	rep.finish()
	if werr := rep.Write(opts.OutDir); werr != nil {
		return rep, werr
	}
	return rep, err
}

func (o *DrillOptions) setDefaults() error {
	info := o.Cluster
	var regions []string
	for _, r := range info.Regions {
		regions = append(regions, r.Name)
	}
	switch {
	case o.Region == "":
		return errors.New("chaos: drill: a region is required")
	case !slices.Contains(regions, o.Region):
		return fmt.Errorf("chaos: drill: the cluster has no region %q (it has %s)", o.Region, strings.Join(regions, ", "))
	case len(regions) < 2:
		return errors.New("chaos: drill: the cluster needs at least two regions")
	case len(info.EtcdEndpoints) == 0:
		return errors.New("chaos: drill: the cluster runs without etcd: there is no home region to fail over")
	case info.StoreMode != cluster.StoreRegionLocal:
		return fmt.Errorf("chaos: drill: store mode %s: a region failover drill needs region-local stores", info.StoreMode)
	case strings.TrimSpace(o.Inject) == "":
		return errors.New("chaos: drill: an inject command is required")
	}
	if o.Failover == "" {
		o.Failover = FailoverManual
	}
	if o.Failover != FailoverManual && o.Failover != FailoverAuto {
		return fmt.Errorf("chaos: drill: failover %q: want %s or %s", o.Failover, FailoverManual, FailoverAuto)
	}
	if o.To == "" {
		for _, r := range regions {
			if r != o.Region {
				o.To = r
				break
			}
		}
	}
	if o.To == o.Region || !slices.Contains(regions, o.To) {
		return fmt.Errorf("chaos: drill: cannot fail %s over to %q", o.Region, o.To)
	}
	if o.Hold <= 0 {
		o.Hold = 2 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = cluster.DefaultRegionLeaseTTL
	}
	if o.Duration <= 0 {
		o.Duration = DefaultDuration
	}
	if o.Clients <= 0 {
		o.Clients = DefaultClients
	}
	if o.MinRate <= 0 {
		o.MinRate = DefaultMinRate
	}
	if o.StuckBound <= 0 {
		o.StuckBound = DefaultStuckBound
	}
	if o.OutDir == "" {
		o.OutDir = "drill-report"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// clientTLS is the TLS configuration that trusts the cluster's CA (nil
// without one).
func clientTLS(info cluster.Info) (*tls.Config, error) {
	if info.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(info.CAFile)
	if err != nil {
		return nil, fmt.Errorf("chaos: drill: cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("chaos: drill: cluster CA %s holds no certificate", info.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func runDrill(ctx context.Context, opts DrillOptions) (*ScenarioReport, error) {
	began := time.Now()
	info := opts.Cluster
	dir := filepath.Join(opts.OutDir, DrillScenario)
	var regions []string
	for _, r := range info.Regions {
		regions = append(regions, r.Name)
	}
	sr := &ScenarioReport{
		Name: DrillScenario,
		Description: fmt.Sprintf("failover drill against a running cluster: %q takes %s down, %s failover to %s, %q heals it",
			opts.Inject, opts.Region, opts.Failover, opts.To, opts.Heal),
		Seed: opts.Seed, Regions: regions, StoreMode: info.StoreMode, Clients: opts.Clients,
		Started: began.UTC(), MinRate: opts.MinRate,
	}
	if len(regions) > 0 {
		sr.NodesPerRegion = len(info.Regions[0].Nodes)
	}
	tlsConfig, err := clientTLS(info)
	if err != nil {
		return sr, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: info.EtcdEndpoints, DialTimeout: 5 * time.Second, TLS: tlsConfig})
	if err != nil {
		return sr, fmt.Errorf("chaos: drill: etcd: %w", err)
	}
	defer cli.Close()
	view := clusterView{info: info, etcd: cli}
	// The tenants' homes when the drill begins (earlier failovers
	// included): the drill's affected tenants are those homed in Region.
	homes, err := homeRegions(ctx, cli, info, regions)
	if err != nil {
		return sr, err
	}

	targets := map[string][]target{}
	for _, r := range info.Regions {
		for i, u := range r.Nodes {
			targets[r.Name] = append(targets[r.Name], target{region: r.Name, node: fmt.Sprintf("%s-%d", r.Name, i), url: u})
		}
	}
	hist := &History{}
	wcfg := drillWorkload
	wcfg.Clients = opts.Clients
	wcfg.TLS = tlsConfig
	run := Scenario{Name: DrillScenario}
	// A run id of its own: a drill may be repeated against one cluster.
	rid := fmt.Sprintf("%s-%d", runID(run, opts.Seed), began.Unix())
	start := time.Now()
	w := newWorkload(wcfg, opts.Seed, rid, regions, targets, info.Tokens, homes, hist, start)
	progress := newProgress(opts.Progress, opts.ProgressTTY, DrillScenario, opts.Duration)
	defer progress.stop()
	progress.attach(w, start)

	trafficCtx, drainCtx, stopTraffic, stopDrain := startTraffic(ctx)
	defer stopTraffic()
	defer stopDrain()
	var wg sync.WaitGroup
	wg.Go(func() { w.run(trafficCtx, drainCtx) })

	warmup := min(max(opts.Duration/5, 2*time.Second), 8*time.Second)
	progress.setPhase("warm-up")
	sleepCtx(ctx, warmup)
	sr.WarmupRate = float64(countEnded(hist.Ops(), 0, time.Since(start))) / time.Since(start).Seconds()
	sr.Valid = sr.WarmupRate >= opts.MinRate
	if !sr.Valid {
		sr.Invalid = fmt.Sprintf("traffic before the fault was %.1f calls/s, below the minimum %.1f/s", sr.WarmupRate, opts.MinRate)
	}
	fault := &commandFault{opts: opts, cli: cli, info: info, tls: tlsConfig}
	steps := []Step{{Fault: fault, Hold: opts.Hold}}
	if sr.Valid && ctx.Err() == nil {
		progress.setPhase("fault")
		progress.setFault(fault.Name())
		ev := FaultEvent{Name: fault.Name(), Hold: opts.Hold.String(), At: time.Since(start).Seconds()}
		if err := fault.inject(ctx); err != nil {
			ev.InjectError = err.Error()
		}
		ev.InjectedFor = time.Since(start).Seconds() - ev.At
		sleepCtx(ctx, opts.Hold)
		ev.HealAt = time.Since(start).Seconds()
		progress.setPhase("heal")
		if err := fault.heal(context.WithoutCancel(ctx)); err != nil {
			ev.HealError = err.Error()
		}
		ev.HealedAt = time.Since(start).Seconds()
		ev.RecoveredAt = ev.HealedAt
		ev.Notes = fault.Notes()
		progress.setFault("")
		sr.Faults = append(sr.Faults, ev)
	}
	progress.setPhase("traffic")
	sleepCtx(ctx, max(opts.Duration-time.Since(start), 2*time.Second))
	stopTraffic()
	progress.setPhase("draining")
	wg.Wait()
	sr.TrafficSeconds = time.Since(start).Seconds()

	if fault.storeLost {
		// Read what is left, not what is gone.
		view.skip = map[string]bool{opts.Region: true}
	}
	progress.setPhase("quiescing")
	prefix := rid + "-"
	qctx := context.WithoutCancel(ctx)
	_, quiesced, took, err := quiesce(qctx, view, prefix, opts.StuckBound)
	if err != nil {
		return sr, err
	}
	progress.setPhase("replay sweep")
	sctx, cancel := context.WithTimeout(qctx, 30*time.Second)
	w.sweep(sctx)
	cancel()
	progress.setPhase("checking")
	st, _, _, err := quiesce(qctx, view, prefix, 5*time.Second)
	if err != nil {
		return sr, err
	}
	homeStore, err := homeStores(qctx, view)
	if err != nil {
		return sr, err
	}
	var charges *provider.ChargeCounts
	if info.ProviderURL != "" && info.ProviderAdminKey != "" {
		cc, err := providerClient(info.ProviderURL, info.ProviderAdminKey, tlsConfig).Charges(qctx)
		if err != nil {
			return sr, fmt.Errorf("chaos: provider charges: %w", err)
		}
		charges = &cc
	}
	ops := hist.Ops()
	sr.Checks = runChecks(&checkInput{
		ops: ops, st: st, homes: homeStore, charges: charges, quiesced: quiesced, quiesceTook: took,
		stuckBound: opts.StuckBound, reexecute: fault.moved != nil, faults: sr.Faults, outDir: dir,
		linTimeout: time.Minute,
	})
	var drillResult CheckResult
	sr.Drills, drillResult = scenarioDrills(steps, sr.Faults, homes, ops, sr.Checks, opts.LeaseTTL)
	if len(sr.Drills) > 0 {
		sr.Drill = sr.Drills[0]
		if fault.storeLost {
			storeLoss(sr.Drill, sr.Checks, ops, st)
			drillResult = drillCheck(sr.Drills...)
		}
	}
	sr.Checks = withCheck(sr.Checks, drillResult)
	progress.stop()
	sr.summarise(ops)
	if err := writeJSON(filepath.Join(dir, "history.json"), ops); err != nil {
		return sr, err
	}
	sr.History = DrillScenario + "/history.json"
	sr.Elapsed = time.Since(began).Round(time.Millisecond).String()
	return sr, nil
}

// homeRegions returns each tenant's effective home region now: its
// placement (or cluster.json's) resolved through every region move.
func homeRegions(ctx context.Context, cli *clientv3.Client, info cluster.Info, regions []string) (map[string]string, error) {
	m, err := routing.NewMap(ctx, cli, nil)
	if err != nil {
		return nil, fmt.Errorf("chaos: drill: routing map: %w", err)
	}
	defer m.Close()
	out := map[string]string{}
	for tenant := range info.Tokens {
		if p, ok := m.Placement(tenant); ok {
			out[tenant] = p.Region
		} else if r := info.Placements[tenant]; r != "" {
			out[tenant] = r
		} else {
			out[tenant] = routing.DefaultHome(tenant, regions)
		}
	}
	return out, nil
}

// commandFault is a drill's fault: the operator's inject and heal
// commands, and the failover between them.
type commandFault struct {
	notes
	opts  DrillOptions
	cli   *clientv3.Client
	info  cluster.Info
	tls   *tls.Config
	moved *routing.RegionMove
	// storeLost: the region's store did not answer at the heal.
	storeLost bool
}

func (f *commandFault) Name() string {
	return fmt.Sprintf("drill(%s, %s failover)", f.opts.Region, f.opts.Failover)
}

// Available, Inject and Heal make commandFault a Fault (a DrillFault); the
// drill calls inject and heal itself.
func (f *commandFault) Available(*cluster.Cluster) bool { return true }

// Inject implements Fault.
func (f *commandFault) Inject(ctx context.Context, _ *cluster.Cluster) error { return f.inject(ctx) }

// Heal implements Fault.
func (f *commandFault) Heal(ctx context.Context, _ *cluster.Cluster) error { return f.heal(ctx) }

// DrillRegion implements DrillFault.
func (f *commandFault) DrillRegion() string { return f.opts.Region }

// FailoverMode implements DrillFault.
func (f *commandFault) FailoverMode() string { return f.opts.Failover }

// shell runs an operator command with sh -c and notes its output.
func (f *commandFault) shell(ctx context.Context, what, command string) error {
	if strings.TrimSpace(command) == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "sh", "-c", command).CombinedOutput()
	if s := strings.TrimSpace(string(out)); s != "" {
		f.note("%s output: %s", what, firstLine(s))
	}
	if err != nil {
		return fmt.Errorf("%s command: %w", what, err)
	}
	return nil
}

func (f *commandFault) inject(ctx context.Context) error {
	before, _, err := routing.GetRegionMove(ctx, f.cli, f.opts.Region)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := f.shell(ctx, "inject", f.opts.Inject); err != nil {
		return err
	}
	wait := 3*f.opts.LeaseTTL + 15*time.Second
	if f.opts.Failover == FailoverManual {
		mv, err := failover.Move(ctx, f.cli, f.opts.Region, f.opts.To, wait, nil)
		if err != nil {
			return err
		}
		f.moved = &mv
		f.note("moved %s's tenants to %s (epoch %d) %v after the inject command began",
			f.opts.Region, mv.ServedBy, mv.Epoch, time.Since(began).Round(100*time.Millisecond))
		return nil
	}
	deadline := began.Add(wait)
	for {
		mv, found, err := routing.GetRegionMove(ctx, f.cli, f.opts.Region)
		if err == nil && found && mv.Epoch > before.Epoch && mv.ServedBy != f.opts.Region {
			f.moved = &mv
			f.note("the nodes moved %s's tenants to %s (epoch %d) %v after the inject command began, nobody acting",
				f.opts.Region, mv.ServedBy, mv.Epoch, time.Since(began).Round(100*time.Millisecond))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the nodes did not fail %s over within %v (do they run --auto-failover-after?)", f.opts.Region, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *commandFault) heal(ctx context.Context) error {
	if strings.TrimSpace(f.opts.Heal) == "" || strings.TrimSpace(f.opts.Heal) == "true" {
		f.note("no heal command: %s stays down; its clients go to the other regions", f.opts.Region)
	} else {
		if err := f.shell(ctx, "heal", f.opts.Heal); err != nil {
			return err
		}
		if f.waitRegionReady(ctx, 30*time.Second) {
			f.note("%s's nodes answer /readyz again", f.opts.Region)
		} else {
			f.note("%s's nodes did not answer /readyz within 30s of the heal command: the region stays down", f.opts.Region)
		}
	}
	if f.moved == nil {
		return nil
	}
	var fromURL, toURL string
	for _, r := range f.info.Regions {
		switch r.Name {
		case f.opts.Region:
			fromURL = r.DatabaseURL
		case f.moved.ServedBy:
			toURL = r.DatabaseURL
		}
	}
	// A region lost with its store: nothing to hand over, and nothing to
	// wait for. What only that store held is lost, which the checks count
	// (the RPO of region-local mode).
	if err := storeAnswers(ctx, fromURL, storeLostAfter); err != nil {
		f.storeLost = true
		f.note("%s's store does not answer (%v): its records, payments and outbox are lost; nothing is handed over, and the drill counts what was acknowledged there alone as lost", f.opts.Region, err)
		return nil
	}
	rep, err := failover.HandoverURLs(ctx, f.cli, f.opts.Region, f.moved.ServedBy,
		failover.Stores{From: fromURL, To: toURL, Effects: f.info.EffectsDatabaseURL})
	noteHandover(&f.notes, rep)
	if err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	return nil
}

// storeLoss adds to d what the loss of its region's store cost, in
// region-local mode: answers that could no longer be replayed (their
// records were in that store alone; the new home answers such a key again
// from what the provider holds, the same bytes, but not as a replay), and
// acknowledged payments whose confirmed ledger entry no surviving store
// holds (their effect was claimed by the lost region, which produced it,
// or would have, in its own store). Both are figures bounded by 0, as the
// RPO is: the drill reports the loss and fails on it.
func storeLoss(d *Drill, checks []CheckResult, ops []*Op, st *dbState) {
	for _, c := range checks {
		if c.Name == CheckSweepReplays {
			d.AnswersLost = c.Violations
		}
	}
	confirmed := map[string]bool{}
	for k := range st.Ledger {
		if k[1] == outbox.EntryPaymentConfirmed {
			confirmed[k[2]] = true
		}
	}
	acked := map[string]bool{}
	for _, o := range ops {
		if o.Status == 201 && o.PaymentID != "" && !acked[o.PaymentID] {
			acked[o.PaymentID] = true
			if !confirmed[o.PaymentID] {
				d.EffectsLost++
			}
		}
	}
	d.Figures = append(d.Figures,
		DrillFigure{Name: "acknowledged answers no longer replayed (records lost with the store)", Value: float64(d.AnswersLost), Met: d.AnswersLost == 0},
		DrillFigure{Name: "acknowledged payments without their ledger entry (effects lost with the store)", Value: float64(d.EffectsLost), Met: d.EffectsLost == 0})
	d.Passed = d.Passed && d.AnswersLost == 0 && d.EffectsLost == 0
}

// storeLostAfter is how long a drill tries to reach the region's store
// before it counts it as lost.
const storeLostAfter = 10 * time.Second

// storeAnswers connects to the database at url and runs a query, trying
// again until within has passed; it returns the last error.
func storeAnswers(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := func() error {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			conn, err := pgx.Connect(cctx, url)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(cctx))
			var one int
			return conn.QueryRow(cctx, "SELECT 1").Scan(&one)
		}()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

// StoreLost reports whether the region's store did not answer at the
// heal: the drill then reports its loss.
func (f *commandFault) StoreLost() bool { return f.storeLost }

// waitRegionReady reports whether every node of the drill's region answers
// 200 on /readyz within timeout.
func (f *commandFault) waitRegionReady(ctx context.Context, timeout time.Duration) bool {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: f.tls}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: healthProbeTimeout}
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, r := range f.info.Regions {
			if r.Name != f.opts.Region {
				continue
			}
			for _, u := range r.Nodes {
				if probe(ctx, client, u+"/readyz", "") != nil {
					ok = false
				}
			}
		}
		if ok {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

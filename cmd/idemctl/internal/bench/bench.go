// Package bench measures the cost of the idempotency layer, in one process and
// one run, alternating phases so that every kind of operation sees the same
// machine. The suites:
//
//   - store: the create_payment write through payments.Service against the
//     same business write (payment row and outbox event, same SQL otherwise)
//     without the layer;
//   - replay: a retry of a completed key against a fresh idempotent write,
//     with and without the replay fast path (store.Options.NoReplayRead);
//   - http: POST /payments end to end over HTTP through the node's handler
//     (region.Server) against a handler without the layer that does the same
//     authentication, body read, strict decode, business write and render;
//   - sidecar: POST /transfers through a node's sidecar route (--proxy-routes)
//     in front of a service doing that business write, against the same
//     request sent to the service directly;
//   - forward: POST /payments of a tenant homed in another region, forwarded
//     by the node across a WAN link (toxiproxy, 40 ms each way; the regions
//     share an embedded etcd), against the same request served at home, with
//     the connections the forwarding opened across the link;
//   - scale: the insert-first claim of fresh keys as the records table grows
//     (bulk-loaded with COPY to each of Config.ScaleRows), and beside a
//     cleanup deleting expired records, with the table's sizes and the
//     cleanup's deletion rate.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/store"
)

// Suite names.
const (
	SuiteStore   = "store"
	SuiteReplay  = "replay"
	SuiteHTTP    = "http"
	SuiteSidecar = "sidecar"
	SuiteForward = "forward"
	SuiteScale   = "scale"
)

// Suites lists every suite in the order "all" runs them.
var Suites = []string{SuiteStore, SuiteReplay, SuiteHTTP, SuiteSidecar, SuiteForward, SuiteScale}

// Config configures a run.
type Config struct {
	// Concurrency is the number of concurrent workers. Default 8.
	Concurrency int
	// PhaseDuration is how long each phase runs. Default 3s.
	PhaseDuration time.Duration
	// Rounds is how many times a suite's phases alternate. Default 3.
	Rounds int
	// ReplayKeys is how many completed keys replays cycle through.
	// Default 1000.
	ReplayKeys int
	// ScaleRows are the records table sizes the scale suite measures the
	// claim at, ascending. Default 10^4 and 10^6.
	ScaleRows []int
	// CleanupExpired is how many records of each kind cleanup handles
	// (cleanupKinds: past the window with a stored answer or a reference,
	// past the metadata retention pruned or referencing) the scale suite
	// loads before each phase with cleanup running. Default 20,000.
	CleanupExpired int
	// ExpiredMetadata is how many records of expired metadata (the week
	// idemd keeps by default) sit in the table while cleanup runs.
	// Default 1,000,000; negative: none.
	ExpiredMetadata int
	// Keys orders the idempotency keys of fresh requests: KeysRandom
	// (the default), spread as random (UUID v4) keys are, or
	// KeysSequential, numbered as a client counting its requests would.
	// On PostgreSQL sequential keys put every claim on the same leaf page
	// of the records' primary key, where serializable transactions'
	// page-level predicate locks make concurrent claims abort each other
	// (see docs/benchmarks.md).
	Keys string
	// ClaimFirst, if set, is a store on the same database opened with
	// store.Options.NoReplayRead: the store and replay suites then also
	// measure the layer without the replay fast path, side by side.
	ClaimFirst *store.Store
	// NoGroupCommit, if set, is a store on the same database opened with
	// store.Options.NoGroupCommit: the sidecar suite then also measures a
	// sidecar whose claims and completions each go in a statement of their
	// own, side by side.
	NoGroupCommit *store.Store
	// Sidecar, if set, is a store on the same database for the sidecar
	// suite's node and its floor's commits: a pool of their own, as
	// idemd's is beside the service it fronts, whose writes go through the
	// suite's store. The suite then also runs the node on the suite's
	// store, sharing the upstream's pool, side by side. Without it the
	// node shares the upstream's pool.
	Sidecar *store.Store
	// Progress, if set, receives one line per finished phase.
	Progress io.Writer

	// sample reads CPU times around every phase (set by Run).
	sample func() cpuSample
	// groups reads the group commits' counts of the suites' stores
	// around every phase (set by Run).
	groups func() groupSample
}

func (c Config) withDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.PhaseDuration <= 0 {
		c.PhaseDuration = 3 * time.Second
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.ReplayKeys <= 0 {
		c.ReplayKeys = 1000
	}
	if len(c.ScaleRows) == 0 {
		c.ScaleRows = []int{10_000, 1_000_000}
	}
	if c.CleanupExpired <= 0 {
		c.CleanupExpired = defaultCleanupExpired
	}
	if c.ExpiredMetadata == 0 {
		c.ExpiredMetadata = 1_000_000
	}
	c.ExpiredMetadata = max(c.ExpiredMetadata, 0)
	return c
}

// Key orders of Config.Keys.
const (
	KeysRandom     = "random"
	KeysSequential = "sequential"
)

// Result summarises one kind of operation over all its phases.
type Result struct {
	Name    string        `json:"name"`
	Ops     int           `json:"ops"`
	Elapsed time.Duration `json:"elapsed"`
	OpsPerS float64       `json:"opsPerSecond"`
	P50     time.Duration `json:"p50"`
	P99     time.Duration `json:"p99"`
	P50Ms   float64       `json:"p50Ms"`
	P99Ms   float64       `json:"p99Ms"`
	Errors  int           `json:"errors"`
	// ClientCPUPerOp is this process's CPU time (user + system) per
	// operation, in microseconds: the benchmark's clients and everything
	// the layer does outside the database (and, in the http suite, the
	// HTTP servers). DBCPUPerOp is the CPU time of the database backends
	// serving the benchmark's database per operation (WAL writer and
	// checkpointer not included). Both 0 when not measurable (the database
	// on another machine, or not Linux).
	ClientCPUPerOp float64 `json:"clientCpuUsPerOp"`
	DBCPUPerOp     float64 `json:"dbCpuUsPerOp"`
	// CoresBusy is both of them over the phases' time: how many of the
	// machine's cores the process and the backends kept busy. A phase
	// that leaves cores idle on a machine they share is bounded by what
	// it waits on, not by its CPU per operation alone. 0 when the CPU is
	// not measurable.
	CoresBusy float64 `json:"coresBusy"`
	// GroupOwn, GroupBatched and GroupBatches are what the store's group
	// commits sent during the operation's phases (store.GroupStats, every
	// kind): writes in a statement of their own, writes in batches of two
	// or more, and those batches. All 0 for an operation that writes
	// through no group (the baselines, a store without group commit).
	GroupOwn     uint64 `json:"groupWritesOwn"`
	GroupBatched uint64 `json:"groupWritesBatched"`
	GroupBatches uint64 `json:"groupBatches"`
	// RoundOpsPerS is each round's ops/s, in the rounds' order: how much
	// the operation moved between its phases.
	RoundOpsPerS []float64 `json:"roundOpsPerSecond,omitempty"`
}

// groupSample sums store.GroupStats over kinds (and stores).
type groupSample struct {
	own, batched, batches uint64
}

// sampleGroups sums what the group commits of stores sent so far.
func sampleGroups(stores ...*store.Store) groupSample {
	var g groupSample
	for _, st := range stores {
		if st == nil {
			continue
		}
		for _, k := range st.GroupStats() {
			g.own += k.Own
			g.batched += k.Batched
			g.batches += k.Batches
		}
	}
	return g
}

// batchedShare renders the share of r's group writes that went in batches
// and the batches' mean size, or dashes when it wrote through no group.
func (r Result) batchedShare() (share, size string) {
	if r.GroupOwn+r.GroupBatched == 0 {
		return "-", "-"
	}
	share = fmt.Sprintf("%.0f%%", 100*float64(r.GroupBatched)/float64(r.GroupOwn+r.GroupBatched))
	size = "-"
	if r.GroupBatches > 0 {
		size = fmt.Sprintf("%.1f", float64(r.GroupBatched)/float64(r.GroupBatches))
	}
	return share, size
}

// Ratio compares the throughput of two results of a suite.
type Ratio struct {
	// Name reads "a/b": a's ops/s divided by b's.
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Rounds is the ratio of each round's phases (a's ops/s in round i
	// divided by b's in round i), in the rounds' order: a ratio whose
	// rounds straddle a target has not settled it. Empty when the results
	// have no rounds of their own.
	Rounds []float64 `json:"rounds,omitempty"`
}

// Spread is the least and the greatest of r's rounds (0 and 0 without
// rounds).
func (r Ratio) Spread() (lo, hi float64) {
	if len(r.Rounds) == 0 {
		return 0, 0
	}
	return slices.Min(r.Rounds), slices.Max(r.Rounds)
}

// SuiteReport is the outcome of one suite.
type SuiteReport struct {
	Suite       string   `json:"suite"`
	Concurrency int      `json:"concurrency"`
	Results     []Result `json:"results"`
	Ratios      []Ratio  `json:"ratios"`
	// Rows counts what the suite left in the store (payments and
	// idempotency records under its tenants), for checking against Ops.
	Payments int `json:"payments"`
	Records  int `json:"records"`
	// Seeded is how many completed keys the suite wrote before measuring.
	Seeded int `json:"seeded"`
	// ForwardDials (forward suite) is how many connections the forwarding
	// node opened across the WAN link in the whole run; RTTMs is the link's
	// round trip.
	ForwardDials int     `json:"forwardDials,omitempty"`
	RTTMs        float64 `json:"rttMs,omitempty"`
	// Sizes (scale suite) is the records table at each measured size;
	// Pruned and Deleted count what cleanup did beside the claims (bodies
	// dropped, then records deleted), CleanedPerSecond both together per
	// second while it had work.
	Sizes            []TableSize `json:"sizes,omitempty"`
	Pruned           int         `json:"pruned,omitempty"`
	Deleted          int         `json:"deleted,omitempty"`
	CleanedPerSecond float64     `json:"cleanedPerSecond,omitempty"`
}

// Result returns the suite's result named name (zero if absent).
func (s SuiteReport) Result(name string) Result {
	for _, r := range s.Results {
		if r.Name == name {
			return r
		}
	}
	return Result{}
}

// Ratio returns the suite's ratio named name (0 if absent).
func (s SuiteReport) Ratio(name string) float64 {
	for _, r := range s.Ratios {
		if r.Name == name {
			return r.Value
		}
	}
	return 0
}

// Report is the outcome of a run of one or more suites.
type Report struct {
	Suites []SuiteReport `json:"suites"`
}

// Suite returns the report of suite name (zero if it did not run).
func (r Report) Suite(name string) SuiteReport {
	for _, s := range r.Suites {
		if s.Suite == name {
			return s
		}
	}
	return SuiteReport{}
}

// Run runs the named suites ("all" for every one) on st, which must be
// migrated. It writes payments under tenants named bench-*.
func Run(ctx context.Context, st *store.Store, cfg Config, suites ...string) (Report, error) {
	cfg = cfg.withDefaults()
	cfg.sample = func() cpuSample { return sampleCPU(ctx, st) }
	cfg.groups = func() groupSample { return sampleGroups(st, cfg.ClaimFirst, cfg.Sidecar) }
	if len(suites) == 0 {
		suites = []string{SuiteStore}
	}
	if slices.Contains(suites, "all") {
		suites = Suites
	}
	var rep Report
	for _, name := range suites {
		var (
			s   SuiteReport
			err error
		)
		switch name {
		case SuiteStore:
			s, err = runStore(ctx, st, cfg)
		case SuiteReplay:
			s, err = runReplay(ctx, st, cfg)
		case SuiteHTTP:
			s, err = runHTTP(ctx, st, cfg)
		case SuiteSidecar:
			s, err = runSidecar(ctx, st, cfg)
		case SuiteForward:
			s, err = runForward(ctx, st, cfg)
		case SuiteScale:
			s, err = runScale(ctx, st, cfg)
		default:
			return Report{}, fmt.Errorf("bench: unknown suite %q (want %s or all)", name, strings.Join(Suites, ", "))
		}
		if err != nil {
			return Report{}, fmt.Errorf("bench: suite %s: %w", name, err)
		}
		rep.Suites = append(rep.Suites, s)
	}
	return rep, nil
}

// op is one kind of operation measured by a suite.
type op struct {
	name string
	fn   func(context.Context) error
}

// alternate runs every op's phase in turn, cfg.Rounds times, and returns one
// Result per op, in ops' order. Odd rounds run the phases in ops' order,
// even rounds in the reverse order: every phase writes, so the tables grow
// through a round and each phase finds them larger than the one before it
// did; in one order the ops listed last (the layer's) would always be
// measured on larger tables than the ops listed first (the baselines).
// Over an even number of rounds every op's mean position is the same.
func alternate(ctx context.Context, cfg Config, suite string, ops []op) ([]Result, error) {
	stats := make([]phaseStats, len(ops))
	for round := 1; round <= cfg.Rounds; round++ {
		for _, i := range roundOrder(round, len(ops)) {
			o := ops[i]
			s, err := phase(ctx, cfg, o.fn)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", o.name, err)
			}
			stats[i].add(s)
			progress(cfg.Progress, suite, round, o.name, s)
		}
	}
	out := make([]Result, len(ops))
	for i, o := range ops {
		out[i] = stats[i].result(o.name)
	}
	return out, nil
}

// roundOrder is the order of n phases in round (1-based): 0 to n-1 in odd
// rounds, n-1 to 0 in even ones.
func roundOrder(round, n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
		if round%2 == 0 {
			order[i] = n - 1 - i
		}
	}
	return order
}

func ratio(results []Result, a, b string) Ratio {
	var x, y Result
	for _, r := range results {
		switch r.Name {
		case a:
			x = r
		case b:
			y = r
		}
	}
	r := Ratio{Name: a + "/" + b}
	if y.OpsPerS > 0 {
		r.Value = x.OpsPerS / y.OpsPerS
	}
	if len(x.RoundOpsPerS) == len(y.RoundOpsPerS) && len(x.RoundOpsPerS) > 1 {
		for i, yi := range y.RoundOpsPerS {
			q := 0.0
			if yi > 0 {
				q = x.RoundOpsPerS[i] / yi
			}
			r.Rounds = append(r.Rounds, q)
		}
	}
	return r
}

type phaseStats struct {
	ops       int
	errors    int
	elapsed   time.Duration
	latencies []time.Duration
	// cpu sums the phases' CPU times; cpuPhases counts the phases that
	// could be measured, phases all of them.
	cpu               cpuSample
	cpuPhases, phases int
	// groups are the group commits' counts of the phases.
	groups groupSample
	// rounds are the phases' ops/s, one per phase added.
	rounds []float64
}

func (p *phaseStats) add(o phaseStats) {
	p.ops += o.ops
	p.errors += o.errors
	p.elapsed += o.elapsed
	p.latencies = append(p.latencies, o.latencies...)
	p.cpu.client += o.cpu.client
	p.cpu.server += o.cpu.server
	p.cpuPhases += o.cpuPhases
	p.phases += o.phases
	p.groups.own += o.groups.own
	p.groups.batched += o.groups.batched
	p.groups.batches += o.groups.batches
	p.rounds = append(p.rounds, o.rounds...)
}

func (p *phaseStats) result(name string) Result {
	slices.Sort(p.latencies)
	r := Result{Name: name, Ops: p.ops, Elapsed: p.elapsed, Errors: p.errors,
		GroupOwn: p.groups.own, GroupBatched: p.groups.batched, GroupBatches: p.groups.batches, RoundOpsPerS: p.rounds}
	if p.elapsed > 0 {
		r.OpsPerS = float64(p.ops) / p.elapsed.Seconds()
	}
	if n := len(p.latencies); n > 0 {
		r.P50 = p.latencies[n*50/100]
		r.P99 = p.latencies[min(n-1, n*99/100)]
	}
	r.P50Ms, r.P99Ms = float64(r.P50.Microseconds())/1000, float64(r.P99.Microseconds())/1000
	if p.ops > 0 && p.phases > 0 && p.cpuPhases == p.phases {
		r.ClientCPUPerOp = float64(p.cpu.client.Microseconds()) / float64(p.ops)
		r.DBCPUPerOp = float64(p.cpu.server.Microseconds()) / float64(p.ops)
		if p.elapsed > 0 {
			r.CoresBusy = (p.cpu.client + p.cpu.server).Seconds() / p.elapsed.Seconds()
		}
	}
	return r
}

func progress(w io.Writer, suite string, round int, name string, s phaseStats) {
	if w == nil {
		return
	}
	fmt.Fprintf(w, "%s round %d %-20s %6d ops in %v (%.0f ops/s, %d errors)\n", suite, round, name, s.ops,
		s.elapsed.Round(time.Millisecond), float64(s.ops)/s.elapsed.Seconds(), s.errors)
}

// phase runs fn from cfg.Concurrency workers for cfg.PhaseDuration. An
// operation started before the deadline runs to its end and is counted.
func phase(ctx context.Context, cfg Config, fn func(context.Context) error) (phaseStats, error) {
	var (
		mu    sync.Mutex
		total phaseStats
		wg    sync.WaitGroup
		first error
	)
	var (
		before       cpuSample
		groupsBefore groupSample
	)
	if cfg.sample != nil {
		before = cfg.sample()
	}
	if cfg.groups != nil {
		groupsBefore = cfg.groups()
	}
	start := time.Now()
	deadline := start.Add(cfg.PhaseDuration)
	for range cfg.Concurrency {
		wg.Go(func() {
			var local phaseStats
			for ctx.Err() == nil && time.Now().Before(deadline) {
				t0 := time.Now()
				err := fn(ctx)
				local.latencies = append(local.latencies, time.Since(t0))
				if err != nil {
					local.errors++
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					continue
				}
				local.ops++
			}
			mu.Lock()
			total.add(local)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	total.phases = 1
	if total.elapsed > 0 {
		total.rounds = []float64{float64(total.ops) / total.elapsed.Seconds()}
	}
	if cfg.sample != nil {
		if after := cfg.sample(); before.ok && after.ok {
			total.cpu = cpuSample{client: after.client - before.client, server: after.server - before.server, ok: true}
			total.cpuPhases = 1
		}
	}
	if cfg.groups != nil {
		after := cfg.groups()
		total.groups = groupSample{own: after.own - groupsBefore.own, batched: after.batched - groupsBefore.batched,
			batches: after.batches - groupsBefore.batches}
	}
	if err := ctx.Err(); err != nil {
		return total, fmt.Errorf("bench: %w", err)
	}
	if total.errors > 0 && total.ops == 0 {
		return total, fmt.Errorf("bench: every operation failed: %w", first)
	}
	return total, nil
}

func body(run string, n int64) []byte {
	return fmt.Appendf(nil, `{"accountId":"acc_%d","amount":"%d.%02d","currency":"EUR","merchantReference":"inv-%s-%d"}`, n%1000, 1+n%500, n%100, run, n)
}

func runID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// countRows counts the payments and records a suite left under tenants with
// the given prefix.
func countRows(ctx context.Context, st *store.Store, tenantPrefix string) (payments, records int, err error) {
	err = st.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM payments WHERE starts_with(tenant_id, $1)),
		(SELECT count(*) FROM idempotency_records WHERE starts_with(tenant_id, $1))`, tenantPrefix).Scan(&payments, &records)
	if err != nil {
		return 0, 0, fmt.Errorf("count rows: %w", err)
	}
	return payments, records, nil
}

var errUnexpected = errors.New("bench: unexpected answer")

// Markdown renders the report as one table per suite.
func (r Report) Markdown() string {
	var b strings.Builder
	for i, s := range r.Suites {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "suite %s, concurrency %d:\n\n", s.Suite, s.Concurrency)
		b.WriteString("| operation | ops | ops/s | p50 ms | p99 ms | errors | client CPU µs/op | db CPU µs/op | cores busy | writes in batches | mean batch |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range s.Results {
			share, size := x.batchedShare()
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %.2f | %d | %.0f | %.0f | %.2f | %s | %s |\n", x.Name, x.Ops, x.OpsPerS, x.P50Ms, x.P99Ms, x.Errors,
				x.ClientCPUPerOp, x.DBCPUPerOp, x.CoresBusy, share, size)
		}
		b.WriteString("\n")
		for _, x := range s.Ratios {
			fmt.Fprintf(&b, "ratio %s: **%.3f**", x.Name, x.Value)
			if len(x.Rounds) > 0 {
				lo, hi := x.Spread()
				fmt.Fprintf(&b, " (rounds %.3f to %.3f)", lo, hi)
			}
			b.WriteString("\n")
		}
		for _, z := range s.Sizes {
			fmt.Fprintf(&b, "records table at %d rows: %.0f MiB table, %.0f MiB indexes\n", z.Rows, float64(z.TableBytes)/(1<<20), float64(z.IndexBytes)/(1<<20))
		}
		if s.Pruned+s.Deleted > 0 {
			fmt.Fprintf(&b, "cleanup beside the claims: %d bodies pruned, %d records deleted, %.0f rows/s while it had work\n", s.Pruned, s.Deleted, s.CleanedPerSecond)
		}
		if s.Suite == SuiteForward {
			home, fwd := s.Result(OpServedAtHome), s.Result(OpForwarded)
			fmt.Fprintf(&b, "forwarded p50 beyond home p50 + one %.0f ms RTT: **%.2f ms**; connections opened across the link: **%d** for %d forwarded requests\n",
				s.RTTMs, fwd.P50Ms-home.P50Ms-s.RTTMs, s.ForwardDials, fwd.Ops+fwd.Errors)
		}
	}
	return b.String()
}

package bench_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem/cmd/idemctl/internal/bench"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

// TestRunCountsWhatItWrote: every suite's counts match the rows it left in
// the store, so the figures in docs/benchmarks.md describe real writes and
// real calls. No timing is asserted.
func TestRunCountsWhatItWrote(t *testing.T) {
	ctx := context.Background()
	st, url := storetest.New(t)
	claimFirst, err := store.Open(ctx, url, store.Options{NoReplayRead: true})
	if err != nil {
		t.Fatal(err)
	}
	defer claimFirst.Close()
	noGroupCommit, err := store.Open(ctx, url, store.Options{NoGroupCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	defer noGroupCommit.Close()
	sidecarStore, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sidecarStore.Close()
	rep, err := bench.Run(ctx, st, bench.Config{Concurrency: 2, PhaseDuration: 200 * time.Millisecond, Rounds: 1, ReplayKeys: 20,
		ClaimFirst: claimFirst, NoGroupCommit: noGroupCommit, Sidecar: sidecarStore, ScaleRows: []int{1000, 5000}, CleanupExpired: 3000, ExpiredMetadata: 4000}, "all")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Suites) != len(bench.Suites) {
		t.Fatalf("ran %d suites, want %d", len(rep.Suites), len(bench.Suites))
	}
	for _, s := range rep.Suites {
		for _, r := range s.Results {
			if r.Ops == 0 || r.Errors != 0 {
				t.Errorf("%s/%s: %d ops, %d errors; want some ops and no error", s.Suite, r.Name, r.Ops, r.Errors)
			}
		}
		for _, r := range s.Ratios {
			if r.Value <= 0 {
				t.Errorf("%s ratio %s = %v", s.Suite, r.Name, r.Value)
			}
		}
	}

	ops := func(s bench.SuiteReport, names ...string) int {
		n := 0
		for _, name := range names {
			n += s.Result(name).Ops
		}
		return n
	}
	for _, tc := range []struct {
		suite             string
		wantPay, wantRecs int
	}{
		{suite: bench.SuiteStore,
			wantPay: ops(rep.Suite(bench.SuiteStore), bench.OpBaseline, bench.OpBaselineSequential, bench.OpBaselineRecord, bench.OpBaselineKey,
				bench.OpIdempotent, bench.OpIdempotentStoredBody, bench.OpIdempotentClaimFirst, bench.OpIdempotentReadFirst),
			wantRecs: ops(rep.Suite(bench.SuiteStore), bench.OpBaselineRecord, bench.OpIdempotent, bench.OpIdempotentStoredBody,
				bench.OpIdempotentClaimFirst, bench.OpIdempotentReadFirst)},
		{suite: bench.SuiteReplay,
			wantPay:  rep.Suite(bench.SuiteReplay).Seeded + ops(rep.Suite(bench.SuiteReplay), bench.OpWrite),
			wantRecs: rep.Suite(bench.SuiteReplay).Seeded + ops(rep.Suite(bench.SuiteReplay), bench.OpWrite)},
		{suite: bench.SuiteHTTP,
			wantPay:  rep.Suite(bench.SuiteHTTP).Seeded + ops(rep.Suite(bench.SuiteHTTP), bench.OpHTTPBaseline, bench.OpHTTPIdempotent),
			wantRecs: rep.Suite(bench.SuiteHTTP).Seeded + ops(rep.Suite(bench.SuiteHTTP), bench.OpHTTPIdempotent)},
		{suite: bench.SuiteForward,
			wantPay:  ops(rep.Suite(bench.SuiteForward), bench.OpServedAtHome, bench.OpForwarded),
			wantRecs: ops(rep.Suite(bench.SuiteForward), bench.OpServedAtHome, bench.OpForwarded)},
		{suite: bench.SuiteSidecar,
			wantPay: ops(rep.Suite(bench.SuiteSidecar), bench.OpUpstreamDirect, bench.OpPlainProxy, bench.OpProxyTwoCommits, bench.OpSidecar, bench.OpSidecarNoGroupCommit,
				bench.OpSidecarSharedPool),
			wantRecs: ops(rep.Suite(bench.SuiteSidecar), bench.OpSidecar, bench.OpSidecarNoGroupCommit, bench.OpSidecarSharedPool)},
		{suite: bench.SuiteScale, wantPay: 0,
			wantRecs: rep.Suite(bench.SuiteScale).Seeded - rep.Suite(bench.SuiteScale).Deleted + allOps(rep.Suite(bench.SuiteScale))},
	} {
		s := rep.Suite(tc.suite)
		if s.Payments != tc.wantPay || s.Records != tc.wantRecs {
			t.Errorf("%s: %d payments and %d records in the store, want %d and %d from the reported ops",
				tc.suite, s.Payments, s.Records, tc.wantPay, tc.wantRecs)
		}
	}
	// Each phase reports what the group commits sent in it: nothing for the
	// baseline (no record), at least a claim a payment for the layer's
	// write, at least a claim and a completion a request through the
	// sidecar (on its own pool or the upstream's), nothing for the sidecar
	// without group commit.
	groupWrites := func(r bench.Result) uint64 { return r.GroupOwn + r.GroupBatched }
	st8, sc := rep.Suite(bench.SuiteStore), rep.Suite(bench.SuiteSidecar)
	for _, c := range []struct {
		r        bench.Result
		min, max uint64
	}{
		{st8.Result(bench.OpBaseline), 0, 0},
		{st8.Result(bench.OpIdempotent), uint64(st8.Result(bench.OpIdempotent).Ops), 1 << 62},
		{st8.Result(bench.OpIdempotentStoredBody), uint64(st8.Result(bench.OpIdempotentStoredBody).Ops), 1 << 62},
		{sc.Result(bench.OpSidecar), 2 * uint64(sc.Result(bench.OpSidecar).Ops), 1 << 62},
		{sc.Result(bench.OpSidecarNoGroupCommit), 0, 0},
		{sc.Result(bench.OpSidecarSharedPool), 2 * uint64(sc.Result(bench.OpSidecarSharedPool).Ops), 1 << 62},
	} {
		if n := groupWrites(c.r); n < c.min || n > c.max || c.r.GroupBatched < c.r.GroupBatches {
			t.Errorf("%s: %d group writes (%d own, %d in %d batches), want %d to %d", c.r.Name, n, c.r.GroupOwn, c.r.GroupBatched, c.r.GroupBatches, c.min, c.max)
		}
	}
	if r := rep.Suite(bench.SuiteReplay); r.Result(bench.OpReplay).Ops == 0 || r.Result(bench.OpReplayClaimFirst).Ops == 0 || r.Result(bench.OpReplayInClaim).Ops == 0 || r.Result(bench.OpReplayFromMemory).Ops == 0 {
		t.Errorf("replay suite without replays: %+v", r)
	}
	if h := rep.Suite(bench.SuiteHTTP); h.Result(bench.OpHTTPReplay).Ops == 0 || h.Result(bench.OpHTTPGet).Ops == 0 || h.Seeded == 0 {
		t.Errorf("http suite without replays or reads: %+v", h)
	}
	if sc := rep.Suite(bench.SuiteScale); len(sc.Sizes) != 3 || sc.Sizes[0].Rows < 1000 || sc.Sizes[1].Rows < 5000 || sc.Pruned == 0 {
		t.Errorf("scale: sizes %+v, %d pruned, %d deleted; want the table at 1000, 5000 and 9000 loaded rows and some expired records pruned", sc.Sizes, sc.Pruned, sc.Deleted)
	}
	md := rep.Markdown()
	for _, want := range []string{"ratio idempotent/baseline", "ratio replay/write", "ratio http idempotent/http baseline", "ratio http replay/http get", "ratio through the sidecar/upstream direct", "connections opened across the link"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	total := storetest.Count(t, st, `SELECT count(*) FROM payments`)
	sum := 0
	for _, s := range rep.Suites {
		sum += s.Payments
	}
	if total != sum {
		t.Errorf("%d payments in the store, suites account for %d", total, sum)
	}
	// The key-only floor wrote one key for each of its payments.
	if keys, want := storetest.Count(t, st, `SELECT count(*) FROM idemctl_bench_keys`), ops(rep.Suite(bench.SuiteStore), bench.OpBaselineKey); keys != want {
		t.Errorf("%d keys in idemctl_bench_keys, the store suite's %q phase reported %d", keys, bench.OpBaselineKey, want)
	}
}

// TestForwardReusesConnections: forwarding across the WAN link opens at most
// one connection per concurrent request, not one per request.
func TestForwardReusesConnections(t *testing.T) {
	st, _ := storetest.New(t)
	const workers = 6
	rep, err := bench.Run(context.Background(), st, bench.Config{Concurrency: workers, PhaseDuration: time.Second, Rounds: 2}, bench.SuiteForward)
	if err != nil {
		t.Fatal(err)
	}
	f := rep.Suite(bench.SuiteForward)
	n := f.Result(bench.OpForwarded).Ops
	t.Logf("%d connections across the link for %d forwarded requests", f.ForwardDials, n)
	if n <= 4*workers {
		t.Fatalf("only %d forwarded requests: too few to tell reuse from a dial per request", n)
	}
	if f.ForwardDials < 1 || f.ForwardDials > workers+1 {
		t.Errorf("%d connections across the link for %d forwarded requests from %d workers; want 1..%d", f.ForwardDials, n, workers, workers+1)
	}
}

func allOps(s bench.SuiteReport) int {
	n := 0
	for _, r := range s.Results {
		n += r.Ops
	}
	return n
}

func TestUnknownSuite(t *testing.T) {
	st, _ := storetest.New(t)
	if _, err := bench.Run(context.Background(), st, bench.Config{}, "nope"); err == nil || !strings.Contains(err.Error(), "unknown suite") {
		t.Errorf("unknown suite: %v", err)
	}
}

// TestKeyOrders: fresh requests' keys are 32 hex digits by default (spread
// as random keys are) and numbered with Config.Keys = KeysSequential.
func TestKeyOrders(t *testing.T) {
	st, _ := storetest.New(t)
	for _, tc := range []struct {
		keys, suite, pattern string
	}{
		{"", bench.SuiteStore, `^[0-9a-f]{32}$`},
		{bench.KeysSequential, bench.SuiteHTTP, `^key-[0-9a-f]{8}-[a-z]*-[0-9]+$`},
	} {
		rep, err := bench.Run(context.Background(), st, bench.Config{Concurrency: 2, PhaseDuration: 100 * time.Millisecond, Rounds: 1, Keys: tc.keys}, tc.suite)
		if err != nil {
			t.Fatal(err)
		}
		if n := rep.Suite(tc.suite).Records; n == 0 {
			t.Fatalf("%s: no records written", tc.suite)
		}
		if bad := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE starts_with(tenant_id, 'bench-`+tc.suite+`-') AND idempotency_key !~ '`+tc.pattern+`'`); bad != 0 {
			t.Errorf("keys %q, suite %s: %d keys do not match %s", tc.keys, tc.suite, bad, tc.pattern)
		}
	}
}

// Package bench measures the cost of the idempotency layer: the create_payment
// write through the engine against the same business write (payment row and
// outbox event, same SQL otherwise) without it, in one process and one run,
// alternating phases so that both see the same machine.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// Config configures Run.
type Config struct {
	// Concurrency is the number of concurrent workers. Default 8.
	Concurrency int
	// PhaseDuration is how long each phase runs. Default 3s.
	PhaseDuration time.Duration
	// Rounds is how many times the baseline and idempotent phases alternate.
	// Default 3.
	Rounds int
	// ReplayKeys is how many completed keys the replay phase cycles through.
	// Default 1000.
	ReplayKeys int
	// Progress, if set, receives one line per finished phase.
	Progress io.Writer
}

// Result summarises one kind of operation over all its phases.
type Result struct {
	Name    string        `json:"name"`
	Ops     int           `json:"ops"`
	Elapsed time.Duration `json:"elapsed"`
	OpsPerS float64       `json:"opsPerSecond"`
	P50     time.Duration `json:"p50"`
	P99     time.Duration `json:"p99"`
	Errors  int           `json:"errors"`
}

// Report is the outcome of Run.
type Report struct {
	Baseline   Result `json:"baseline"`
	Idempotent Result `json:"idempotent"`
	Replay     Result `json:"replay"`
	// Ratio is idempotent ops/s divided by baseline ops/s.
	Ratio       float64 `json:"ratio"`
	Concurrency int     `json:"concurrency"`
}

type phaseStats struct {
	ops       int
	errors    int
	elapsed   time.Duration
	latencies []time.Duration
}

func (p *phaseStats) add(o phaseStats) {
	p.ops += o.ops
	p.errors += o.errors
	p.elapsed += o.elapsed
	p.latencies = append(p.latencies, o.latencies...)
}

func (p *phaseStats) result(name string) Result {
	slices.Sort(p.latencies)
	r := Result{Name: name, Ops: p.ops, Elapsed: p.elapsed, Errors: p.errors}
	if p.elapsed > 0 {
		r.OpsPerS = float64(p.ops) / p.elapsed.Seconds()
	}
	if n := len(p.latencies); n > 0 {
		r.P50 = p.latencies[n*50/100]
		r.P99 = p.latencies[min(n-1, n*99/100)]
	}
	return r
}

// Run benchmarks on st, which must be migrated. It writes payments under
// tenants named bench-*.
func Run(ctx context.Context, st *store.Store, cfg Config) (Report, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.PhaseDuration <= 0 {
		cfg.PhaseDuration = 3 * time.Second
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.ReplayKeys <= 0 {
		cfg.ReplayKeys = 1000
	}
	svc := payments.NewService(st, payments.Config{Region: "bench"})
	run := runID()
	var seq atomic.Int64
	next := func() int64 { return seq.Add(1) }

	baseline := func(ctx context.Context) error {
		n := next()
		cmd, err := payments.ParseCommand(body(run, n), "")
		if err != nil {
			return err
		}
		p := store.Payment{Tenant: "bench-" + run, ID: fmt.Sprintf("pay_base_%s_%d", run, n), AccountID: cmd.AccountID,
			AmountMinor: cmd.AmountMinor, Currency: cmd.Currency, MerchantReference: cmd.MerchantReference,
			Channel: cmd.Channel, Status: "PENDING"}
		p.ProviderKey = payments.ProviderKey(p.ID)
		payload, err := json.Marshal(map[string]string{"eventId": "evt_" + p.ID + "_created", "type": "PaymentCreated",
			"paymentId": p.ID, "accountId": p.AccountID, "amount": cmd.Amount(), "currency": p.Currency})
		if err != nil {
			return err
		}
		ev := store.Event{ID: "evt_" + p.ID + "_created", Tenant: p.Tenant, AggregateID: p.ID, Type: "PaymentCreated", Payload: payload}
		return st.ExecTx(ctx, func(tx pgx.Tx) error { return store.InsertPaymentOnly(ctx, tx, p, ev) })
	}
	idempotent := func(ctx context.Context) error {
		n := next()
		res, err := svc.Create(ctx, payments.Request{Tenant: "bench-" + run, Key: fmt.Sprintf("key-%s-%d", run, n), Body: body(run, n)})
		if err == nil && (res.Response.Status != 201 || res.Replayed) {
			err = fmt.Errorf("bench: unexpected answer %d replayed=%v", res.Response.Status, res.Replayed)
		}
		return err
	}
	var base, idem, replay phaseStats
	for round := 1; round <= cfg.Rounds; round++ {
		for _, ph := range []struct {
			name string
			fn   func(context.Context) error
			into *phaseStats
		}{{"baseline", baseline, &base}, {"idempotent", idempotent, &idem}} {
			s, err := phase(ctx, cfg, ph.fn)
			if err != nil {
				return Report{}, err
			}
			ph.into.add(s)
			progress(cfg.Progress, round, ph.name, s)
		}
	}
	// Replay: complete ReplayKeys operations, then retry them.
	replayTenant := "bench-replay-" + run
	for i := range cfg.ReplayKeys {
		if _, err := svc.Create(ctx, payments.Request{Tenant: replayTenant, Key: fmt.Sprintf("r-%d", i), Body: body(run+"r", int64(i))}); err != nil {
			return Report{}, fmt.Errorf("bench: seed replay keys: %w", err)
		}
	}
	var rseq atomic.Int64
	s, err := phase(ctx, cfg, func(ctx context.Context) error {
		i := rseq.Add(1) % int64(cfg.ReplayKeys)
		res, err := svc.Create(ctx, payments.Request{Tenant: replayTenant, Key: fmt.Sprintf("r-%d", i), Body: body(run+"r", i)})
		if err == nil && !res.Replayed {
			err = fmt.Errorf("bench: key r-%d was not replayed", i)
		}
		return err
	})
	if err != nil {
		return Report{}, err
	}
	replay.add(s)
	progress(cfg.Progress, 1, "replay", s)

	rep := Report{Baseline: base.result("baseline"), Idempotent: idem.result("idempotent"), Replay: replay.result("replay"), Concurrency: cfg.Concurrency}
	if rep.Baseline.OpsPerS > 0 {
		rep.Ratio = rep.Idempotent.OpsPerS / rep.Baseline.OpsPerS
	}
	return rep, nil
}

func progress(w io.Writer, round int, name string, s phaseStats) {
	if w == nil {
		return
	}
	fmt.Fprintf(w, "round %d %-10s %6d ops in %v (%.0f ops/s, %d errors)\n", round, name, s.ops, s.elapsed.Round(time.Millisecond),
		float64(s.ops)/s.elapsed.Seconds(), s.errors)
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

// Markdown renders the report as a table.
func (r Report) Markdown() string {
	row := func(x Result) string {
		return fmt.Sprintf("| %s | %d | %.0f | %.2f | %.2f | %d |\n", x.Name, x.Ops, x.OpsPerS,
			float64(x.P50.Microseconds())/1000, float64(x.P99.Microseconds())/1000, x.Errors)
	}
	return "| operation | ops | ops/s | p50 ms | p99 ms | errors |\n|---|---:|---:|---:|---:|---:|\n" +
		row(r.Baseline) + row(r.Idempotent) + row(r.Replay) +
		fmt.Sprintf("\nratio idempotent/baseline: **%.3f** (concurrency %d)\n", r.Ratio, r.Concurrency)
}

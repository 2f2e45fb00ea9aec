package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/store"
)

// Operation name prefixes of the scale suite.
const (
	OpClaimAt             = "claim at "
	OpClaimNoCleanup      = "claim, no cleanup"
	OpClaimDuringCleanup  = "claim during cleanup"
	scaleTenants          = 1000
	scaleCopyBatch        = 50_000
	defaultCleanupExpired = 20_000
)

// TableSize is the records table's size at one step of the scale suite.
type TableSize struct {
	Rows       int64 `json:"rows"`
	TableBytes int64 `json:"tableBytes"`
	IndexBytes int64 `json:"indexBytes"`
}

// scaleBody is the stored answer of every bulk-loaded record: the size of a
// payment's v2 body.
var scaleBody = []byte(`{"paymentId":"pay_0123456789abcdef0123","status":"PENDING","accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"inv-0123456789","channel":"web"}`)

// scaleKey is the n-th bulk-loaded key: a UUID-like hex string, so loaded
// keys spread over the primary key's B-tree as clients' keys do.
func scaleKey(run string, n int64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	sum := sha256.Sum256(append([]byte(run), b[:]...))
	return hex.EncodeToString(sum[:16])
}

// recordKind is what a bulk-loaded record looks like to cleanup.
type recordKind int

const (
	// live: COMPLETED with a day of its window left.
	live recordKind = iota
	// prunable: COMPLETED, its window ended an hour ago and created 25
	// hours ago (past the default body retention): cleanup drops its body.
	prunable
	// kept: EXPIRED (body already dropped), its window ended between an
	// hour and six days ago: metadata cleanup keeps for a week.
	kept
	// deletable: EXPIRED, its window ended eight days ago: cleanup deletes
	// it.
	deletable
	// referenced: COMPLETED, an answer rendered from the resource it
	// references (a payment's record: no body, no headers), its window
	// ended an hour ago: cleanup has nothing to drop.
	referenced
	// referencedOld: referenced, its window ended eight days ago: cleanup
	// deletes it.
	referencedOld
)

// cleanupKinds are the records loaded before each cleanup phase,
// cfg.CleanupExpired of each: what a week of a node's traffic leaves
// behind for one cleanup pass, with records that keep their answer (the
// sidecar's) and records that reference a payment.
var cleanupKinds = []recordKind{prunable, deletable, referenced, referencedOld}

// loadRecords bulk-loads records (COPY) of kind, of tenants prefix-t0..t999,
// with keys scaleKey(run, from..to-1).
func loadRecords(ctx context.Context, st *store.Store, prefix, run string, from, to int64, kind recordKind) error {
	now := time.Now()
	for lo := from; lo < to; lo += scaleCopyBatch {
		hi := min(lo+scaleCopyBatch, to)
		n := lo
		_, err := st.Pool().CopyFrom(ctx, pgx.Identifier{"idempotency_records"},
			[]string{"tenant_id", "operation_name", "idempotency_key", "request_hash", "hash_version", "status", "checkpoint",
				"response_status", "response_headers", "response_body", "response_by_reference", "resource_type", "resource_id",
				"created_at", "updated_at", "expires_at"},
			pgx.CopyFromFunc(func() ([]any, error) {
				if n >= hi {
					return nil, nil
				}
				key := scaleKey(run, n)
				status, headers, body := string(idem.StatusCompleted), []byte(`{"Content-Type":["application/json"]}`), scaleBody
				expires := now.Add(24 * time.Hour)
				byRef, resType, resID := false, any(nil), any(nil)
				switch kind {
				case prunable:
					expires = now.Add(-time.Hour)
				case kept:
					status, headers, body = string(idem.StatusExpired), nil, nil
					expires = now.Add(-time.Hour - time.Duration(n%1000)*(5*24*time.Hour/1000))
				case deletable:
					status, headers, body = string(idem.StatusExpired), nil, nil
					expires = now.Add(-8 * 24 * time.Hour)
				case referenced, referencedOld:
					headers, body, byRef, resType, resID = nil, nil, true, "payment", "pay_"+key[:20]
					expires = now.Add(-time.Hour)
					if kind == referencedOld {
						expires = now.Add(-8 * 24 * time.Hour)
					}
				}
				created := expires.Add(-24 * time.Hour)
				row := []any{fmt.Sprintf("%s-t%d", prefix, n%scaleTenants), "create_payment", key, "v2:" + key, fingerprint.Version,
					status, string(idem.CheckpointCompleted), 201, headers, body, byRef, resType, resID, created, created, expires}
				n++
				return row, nil
			}))
		if err != nil {
			return fmt.Errorf("load records: %w", err)
		}
	}
	return nil
}

// fill bulk-loads records from..to-1 of kind (none when to <= from),
// vacuums and analyzes the table as autovacuum would have by then, and
// returns its size.
func fill(ctx context.Context, st *store.Store, cfg Config, prefix, run string, from, to int64, kind recordKind) (TableSize, error) {
	if to > from {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "scale: loading %d records\n", to-from)
		}
		if err := loadRecords(ctx, st, prefix, run, from, to, kind); err != nil {
			return TableSize{}, err
		}
		if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE idempotency_records`); err != nil {
			return TableSize{}, fmt.Errorf("vacuum: %w", err)
		}
		flush(ctx, st, cfg)
	}
	return tableSize(ctx, st)
}

// flush writes out what a bulk load dirtied (CHECKPOINT) before a
// measured phase, so that the load's writes do not land in it. A role that
// may not run CHECKPOINT (PostgreSQL: superuser or pg_checkpoint) is told
// so on the progress output, and the run goes on.
func flush(ctx context.Context, st *store.Store, cfg Config) {
	if _, err := st.Pool().Exec(ctx, `CHECKPOINT`); err != nil && cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "scale: CHECKPOINT refused (%v): a bulk load's writes may land in the next phase\n", err)
	}
}

// tableSize reads the records table's row estimate-free count and sizes.
func tableSize(ctx context.Context, st *store.Store) (TableSize, error) {
	var s TableSize
	err := st.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_records),
		pg_table_size('idempotency_records'), pg_indexes_size('idempotency_records')`).Scan(&s.Rows, &s.TableBytes, &s.IndexBytes)
	if err != nil {
		return s, fmt.Errorf("table size: %w", err)
	}
	return s, nil
}

// claimer claims fresh keys (Coordinator.Begin, the insert-first claim) in
// the loaded tenants.
func claimer(st *store.Store, prefix, run string) func(context.Context) error {
	var seq atomic.Int64
	return func(ctx context.Context) error {
		n := seq.Add(1)
		key := scaleKey(run+"-claim", n)
		d, err := st.Begin(ctx, idem.BeginRequest{
			Scope:         idem.Scope{Tenant: fmt.Sprintf("%s-t%d", prefix, n%scaleTenants), Operation: "create_payment", Key: key},
			RequestHashes: []string{"v2:" + key}, HashVersion: fingerprint.Version, Owner: "bench", HomeRegion: "bench",
			LockFor: time.Minute, Window: 24 * time.Hour,
		})
		if err == nil && d.Outcome != idem.OutcomeExecute {
			err = fmt.Errorf("%w: claim of a fresh key: %v", errUnexpected, d.Outcome)
		}
		return err
	}
}

// runScale measures the insert-first claim of fresh keys as the records
// table grows to each of cfg.ScaleRows (bulk-loaded, untimed), then, at the
// largest size, the claim with and without cleanup running beside it
// (cfg.CleanupExpired expired records loaded before each cleanup phase),
// and the cleanup's deletion rate.
func runScale(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteScale, cfg)
	prefix := w.tenant
	rep := SuiteReport{Suite: SuiteScale, Concurrency: cfg.Concurrency}
	var loaded int64
	for _, rows := range cfg.ScaleRows {
		size, err := fill(ctx, st, cfg, prefix, w.run, loaded, int64(rows), live)
		if err != nil {
			return rep, err
		}
		loaded = max(loaded, int64(rows))
		rep.Sizes = append(rep.Sizes, size)
		res, err := alternate(ctx, cfg, SuiteScale, []op{{OpClaimAt + rowsLabel(rows), claimer(st, prefix, fmt.Sprint(w.run, "-", rows))}})
		if err != nil {
			return rep, err
		}
		rep.Results = append(rep.Results, res...)
	}
	if len(cfg.ScaleRows) > 1 {
		first, last := rep.Results[0], rep.Results[len(cfg.ScaleRows)-1]
		rep.Ratios = append(rep.Ratios,
			Ratio{Name: "p50 " + last.Name + " / p50 " + first.Name, Value: latencyRatio(last.P50, first.P50)},
			Ratio{Name: "p99 " + last.Name + " / p99 " + first.Name, Value: latencyRatio(last.P99, first.P99)})
	}

	// Cleanup beside the claims, at the largest size, with a week of
	// expired metadata kept (cfg.ExpiredMetadata records) as idemd keeps it.
	size, err := fill(ctx, st, cfg, prefix+"-kept", w.run, 0, int64(cfg.ExpiredMetadata), kept)
	if err != nil {
		return rep, err
	}
	rep.Sizes = append(rep.Sizes, size)
	var plain, cleaning phaseStats
	var pruned, deleted atomic.Int64
	var cleanTime time.Duration
	claim := claimer(st, prefix, w.run+"-cleanup")
	for round := 1; round <= cfg.Rounds; round++ {
		s, err := phase(ctx, cfg, claim)
		if err != nil {
			return rep, err
		}
		plain.add(s)
		progress(cfg.Progress, SuiteScale, round, OpClaimNoCleanup, s)
		base := int64(round) * 1_000_000_000
		for _, kind := range cleanupKinds {
			if err := loadRecords(ctx, st, fmt.Sprintf("%s-k%d", prefix, kind), w.run, base, base+int64(cfg.CleanupExpired), kind); err != nil {
				return rep, err
			}
		}
		flush(ctx, st, cfg)
		// idemd's cleanup worker with its defaults: bodies dropped a window
		// after creation, metadata kept a week, batches of 500, 50 ms
		// pauses; each phase starts it anew, as each interval would.
		cctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		start := time.Now()
		var took atomic.Int64
		var cleanErr error // written by the cleanup goroutine, read after wg.Wait
		wg.Go(func() {
			defer func() { took.Store(int64(time.Since(start))) }()
			// Store.Cleanup's steps and pauses, batch by batch, so that the
			// phase's end stops it between batches, never inside one.
			qctx := context.WithoutCancel(cctx)
			for _, step := range []struct {
				run   func() (int, error)
				count *atomic.Int64
			}{
				{func() (int, error) { return store.PruneBodies(qctx, st.Pool(), 24*time.Hour, 500) }, &pruned},
				{func() (int, error) { return store.DeleteExpired(qctx, st.Pool(), 7*24*time.Hour, 500) }, &deleted},
			} {
				for cctx.Err() == nil {
					n, err := step.run()
					step.count.Add(int64(n))
					if err != nil {
						cleanErr = err
						return
					}
					if n < 500 {
						break
					}
					select {
					case <-cctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		})
		s, err = phase(ctx, cfg, claim)
		stop()
		wg.Wait()
		if err != nil {
			return rep, err
		}
		if cleanErr != nil {
			return rep, fmt.Errorf("cleanup beside the claims: %w", cleanErr)
		}
		cleanTime += time.Duration(took.Load())
		cleaning.add(s)
		progress(cfg.Progress, SuiteScale, round, OpClaimDuringCleanup, s)
	}
	np, nc := plain.result(OpClaimNoCleanup), cleaning.result(OpClaimDuringCleanup)
	rep.Results = append(rep.Results, np, nc)
	rep.Ratios = append(rep.Ratios, Ratio{Name: "p99 " + nc.Name + " / p99 " + np.Name, Value: latencyRatio(nc.P99, np.P99)})
	rep.Pruned, rep.Deleted = int(pruned.Load()), int(deleted.Load())
	if cleanTime > 0 {
		rep.CleanedPerSecond = float64(rep.Pruned+rep.Deleted) / cleanTime.Seconds()
	}
	rep.Payments, rep.Records, err = countRows(ctx, st, prefix)
	rep.Seeded = int(loaded) + cfg.ExpiredMetadata + len(cleanupKinds)*cfg.Rounds*cfg.CleanupExpired
	return rep, err
}

func latencyRatio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// rowsLabel writes 10000 as 10^4 and other counts as they are.
func rowsLabel(n int) string {
	e, m := 0, n
	for m >= 10 && m%10 == 0 {
		m /= 10
		e++
	}
	if m == 1 && e > 0 {
		return fmt.Sprintf("10^%d rows", e)
	}
	return fmt.Sprintf("%d rows", n)
}

package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/store"
)

// BenchmarkCheckpoints: owners' checkpoints (the engine's STARTED before
// Execute, a remote engine's own steps), each of an open record of its
// own, sent by 1, 8 and 32 concurrent owners, through the group commit
// and through a store opened with NoGroupCommit (each checkpoint its own
// statement and commit), on one database:
//
//	go test ./store -run '^$' -bench BenchmarkCheckpoints -benchtime 3000x -count 3
func BenchmarkCheckpoints(b *testing.B) {
	ctx := context.Background()
	url := pgtest.NewDatabase(b)
	var run atomic.Int64
	for _, c := range []int{1, 8, 32} {
		for _, grouped := range []bool{true, false} {
			name := fmt.Sprintf("c=%d/group", c)
			if !grouped {
				name = fmt.Sprintf("c=%d/alone", c)
			}
			b.Run(name, func(b *testing.B) {
				st, err := store.Open(ctx, url, store.Options{MaxConns: 40, NoGroupCommit: !grouped})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				if err := st.Migrate(ctx); err != nil {
					b.Fatal(err)
				}
				// b.N open records of this run, claimed at once (untimed).
				tenant := fmt.Sprintf("bench-%d", run.Add(1))
				if _, err := st.Pool().Exec(ctx, `INSERT INTO idempotency_records
					(tenant_id, operation_name, idempotency_key, request_hash, hash_version, status, checkpoint,
					 owner, fencing_token, locked_until, expires_at)
					SELECT $1, 'op', 'k-' || n, 'v2:x', 2, 'IN_PROGRESS', 'RECEIVED', 'bench', 1,
						now() + INTERVAL '1 hour', now() + INTERVAL '1 day'
					FROM generate_series(0, $2::INT8 - 1) n`, tenant, b.N); err != nil {
					b.Fatal(err)
				}
				if _, err := st.Pool().Exec(ctx, `ANALYZE idempotency_records`); err != nil {
					b.Fatal(err)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for range c {
					wg.Go(func() {
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								return
							}
							lease := idem.Lease{Scope: idem.Scope{Tenant: tenant, Operation: "op", Key: fmt.Sprint("k-", i)}, Token: 1, Owner: "bench"}
							if err := st.Checkpoint(ctx, lease, "STARTED"); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

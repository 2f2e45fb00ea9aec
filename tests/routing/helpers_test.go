package routing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/routing"
)

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// txnOps is how many puts placeTenants batches into one transaction
// (etcd's default --max-txn-ops).
const txnOps = 128

// placeTenants gives n tenants ("<prefix>-<i>") their own placement in
// region, many puts per transaction, and returns their names.
func placeTenants(tb testing.TB, cli *clientv3.Client, prefix, region string, n int) []string {
	tb.Helper()
	val, _ := json.Marshal(map[string]string{"region": region})
	tenants := make([]string, n)
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			tb.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range n {
		tenants[i] = fmt.Sprintf("%s-%07d", prefix, i)
		ops = append(ops, clientv3.OpPut(routing.PlacementPrefix+tenants[i], string(val)))
		if len(ops) == txnOps {
			flush()
		}
	}
	flush()
	return tenants
}

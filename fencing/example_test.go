package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fencing"
	"github.com/idemcoord/idem/memcoord"
)

// Two recoverers (say, in two regions) race for a record whose outcome was
// lost. Each holds an etcd lease; the scope's etcd lock goes to one, and
// the record takes the lock's token (an etcd revision) as its fencing
// token. When the next owner takes over under a higher token, the first
// one's late write is refused by the record itself. The record is kept in
// memory here (package memcoord); the store and the engine do the same
// with a *store.Store and engine.Options.Locker.
func Example() {
	// The etcd the package's tests start; a service passes its own etcd
	// cluster's endpoints.
	cli, err := clientv3.New(clientv3.Config{Endpoints: fencing.ExampleEndpoints,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	must(err)
	defer cli.Close()
	ctx := context.Background()

	coord := memcoord.New()
	scope := idem.Scope{Tenant: "acme", Operation: "create_transfer", Key: "order-42"}
	begin := idem.BeginRequest{Scope: scope, RequestHashes: []string{"v2:5e1f"}, HashVersion: 2,
		LockFor: time.Minute, Window: 24 * time.Hour, ExternalFencing: true}
	first, err := coord.Begin(ctx, begin)
	must(err)
	must(coord.Fail(ctx, first.Lease, idem.Failure{Status: idem.StatusUnknown})) // the provider's answer was lost
	fmt.Println("first owner:", first.Outcome, "then", idem.StatusUnknown)

	lockerA, closeA := newLocker(ctx, cli)
	defer closeA()
	lockerB, closeB := newLocker(ctx, cli)
	defer closeB()
	key := engine.LockKey(scope)

	lockA, err := lockerA.TryLock(ctx, key)
	must(err)
	_, err = lockerB.TryLock(ctx, key)
	fmt.Println("B while A holds the lock: locked =", errors.Is(err, idem.ErrLocked))

	begin.Owner, begin.FencingToken = "recoverer-a", lockA.Token()
	a, err := coord.Begin(ctx, begin)
	must(err)
	fmt.Println("A:", a.Outcome, "under its lock's token:", a.Lease.Token == lockA.Token())
	// A asks the provider, which does not know yet; A lets go.
	must(coord.Fail(ctx, a.Lease, idem.Failure{Status: idem.StatusUnknown}))
	must(lockA.Unlock(ctx))

	lockB, err := lockerB.TryLock(ctx, key)
	must(err)
	begin.Owner, begin.FencingToken = "recoverer-b", lockB.Token()
	b, err := coord.Begin(ctx, begin)
	must(err)
	fmt.Println("B:", b.Outcome, "under a higher token:", b.Lease.Token > a.Lease.Token)

	// The provider's answer reaches A after all: its write is fenced off.
	err = coord.Complete(ctx, a.Lease, idem.Completion{Response: idem.Response{Status: 201}})
	fmt.Println("A's late write:", idem.ErrorCode(err))
	must(coord.Complete(ctx, b.Lease, idem.Completion{Response: idem.Response{Status: 201}}))
	must(lockB.Unlock(ctx))
	rec, err := coord.Get(ctx, scope)
	must(err)
	fmt.Println("record:", rec.Status, "by", rec.Owner)
	// Output:
	// first owner: execute then UNKNOWN_REQUIRES_RECOVERY
	// B while A holds the lock: locked = true
	// A: recover under its lock's token: true
	// B: recover under a higher token: true
	// A's late write: FENCING_TOKEN_STALE
	// record: COMPLETED by recoverer-b
}

// newLocker grants a lease of its own (one per process) and a Locker on it.
func newLocker(ctx context.Context, cli *clientv3.Client) (*fencing.Locker, func()) {
	lease, err := fencing.Grant(ctx, cli, 10*time.Second)
	must(err)
	locker, err := fencing.NewLocker(cli, lease, "idem/locks/")
	must(err)
	return locker, func() {
		_ = locker.Close()
		_ = lease.Close(ctx)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

package fencing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
)

func TestTryLockTwoLockers(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 10*time.Second)
	b := newOwner(t, srv, 10*time.Second)
	ctx := testCtx(t)

	lkA, err := a.tryLock(ctx, "order/42")
	if err != nil {
		t.Fatalf("A TryLock: %v", err)
	}
	_, err = b.locker.TryLock(ctx, "order/42")
	if !errors.Is(err, ErrLocked) || !errors.Is(err, idem.ErrLocked) || !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("B TryLock while A holds = %v, want ErrLocked wrapping idem.ErrLocked and concurrency.ErrLocked", err)
	}
	if err := lkA.Check(); err != nil {
		t.Fatalf("A Check: %v", err)
	}
	rev, leaseID := createRevision(t, a.cli, lkA.Key())
	if rev != lkA.Token() || leaseID != a.lease.ID() {
		t.Fatalf("A key rev %d lease %x, want token %d lease %x", rev, leaseID, lkA.Token(), a.lease.ID())
	}

	if err := lkA.Unlock(ctx); err != nil {
		t.Fatalf("A Unlock: %v", err)
	}
	if keyExists(t, a.cli, lkA.Key()) {
		t.Fatal("A's key survived Unlock")
	}
	if err := lkA.Check(); !errors.Is(err, ErrReleased) || lkA.Valid() {
		t.Fatalf("A Check after Unlock = %v, want ErrReleased", err)
	}
	if err := lkA.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}

	lkB, err := b.tryLock(ctx, "order/42")
	if err != nil {
		t.Fatalf("B TryLock after A unlocked: %v", err)
	}
	if lkB.Token() <= lkA.Token() {
		t.Fatalf("B token %d not strictly above A token %d", lkB.Token(), lkA.Token())
	}
	if _, err := a.tryLock(ctx, "order/42"); !errors.Is(err, ErrLocked) {
		t.Fatalf("A TryLock while B holds = %v, want ErrLocked", err)
	}
}

func TestTryLockConcurrentExactlyOneWins(t *testing.T) {
	srv := etcdtest.Start(t)
	const n, rounds = 10, 5
	owners := make([]*owner, n)
	for i := range owners {
		owners[i] = newOwner(t, srv, 10*time.Second)
	}
	ctx := testCtx(t)
	for round := range rounds {
		key := fmt.Sprintf("contended/%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		locks := make([]*Lock, n)
		errs := make([]error, n)
		for i, o := range owners {
			wg.Go(func() {
				<-start
				locks[i], errs[i] = o.tryLock(ctx, key)
			})
		}
		close(start)
		wg.Wait()

		var winners []*Lock
		for i := range owners {
			switch {
			case errs[i] == nil:
				winners = append(winners, locks[i])
			case !errors.Is(errs[i], ErrLocked):
				t.Fatalf("round %d owner %d: %v, want nil or ErrLocked", round, i, errs[i])
			}
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1", round, len(winners))
		}
		rev, _ := createRevision(t, owners[0].cli, winners[0].Key())
		if rev != winners[0].Token() {
			t.Fatalf("round %d: token %d, key create revision %d", round, winners[0].Token(), rev)
		}
		// Losers cleaned up their waiter keys: only the winner's remains.
		resp, err := owners[0].cli.Get(ctx, testPrefix+"contended%2F"+fmt.Sprint(round)+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatalf("Get prefix: %v", err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("round %d: %d lock keys left, want 1", round, len(resp.Kvs))
		}
	}
}

// Mutual exclusion under churn: owners repeatedly take, use and release
// the same key; at most one holds a valid lock at a time, and the fenced
// resource sees strictly increasing tokens.
func TestMutualExclusionUnderChurn(t *testing.T) {
	srv := etcdtest.Start(t)
	const n, attempts = 6, 15
	owners := make([]*owner, n)
	for i := range owners {
		owners[i] = newOwner(t, srv, 10*time.Second)
	}
	ctx := testCtx(t)
	var inside atomic.Int32
	var acquired atomic.Int32
	res := &fencedResource{}
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for _, o := range owners {
		wg.Go(func() {
			for range attempts {
				lk, err := o.tryLock(ctx, "churn")
				if errors.Is(err, ErrLocked) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				acquired.Add(1)
				if c := inside.Add(1); c != 1 {
					errc <- fmt.Errorf("%d owners inside the critical section", c)
				}
				if err := lk.Check(); err != nil {
					errc <- err
				}
				if err := res.Write(lk.Token()); err != nil {
					errc <- fmt.Errorf("token %d: %w", lk.Token(), err)
				}
				inside.Add(-1)
				if err := lk.Unlock(ctx); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if acquired.Load() == 0 {
		t.Fatal("nobody ever acquired the lock")
	}
	for i := 1; i < len(res.writes); i++ {
		if res.writes[i] <= res.writes[i-1] {
			t.Fatalf("tokens not strictly increasing: %v", res.writes)
		}
	}
}

func TestTokensIncreaseAcrossOwners(t *testing.T) {
	srv := etcdtest.Start(t)
	admin := srv.Client(t)
	ctx := testCtx(t)
	var prev int64
	for i := range 5 {
		o := newOwnerWithClient(t, admin, 5*time.Second)
		// Unrelated writes move the revision between owners.
		for j := range i {
			if _, err := admin.Put(ctx, fmt.Sprintf("noise/%d/%d", i, j), "x"); err != nil {
				t.Fatalf("Put: %v", err)
			}
		}
		lk, err := o.tryLock(ctx, "succession")
		if err != nil {
			t.Fatalf("owner %d TryLock: %v", i, err)
		}
		rev, leaseID := createRevision(t, admin, lk.Key())
		if lk.Token() != rev {
			t.Fatalf("owner %d token %d != key create revision %d", i, lk.Token(), rev)
		}
		if leaseID != o.lease.ID() {
			t.Fatalf("owner %d key bound to lease %x, want %x", i, leaseID, o.lease.ID())
		}
		if lk.Token() <= prev {
			t.Fatalf("owner %d token %d not above previous %d", i, lk.Token(), prev)
		}
		prev = lk.Token()
		// Alternate the ways ownership ends.
		if i%2 == 0 {
			err = lk.Unlock(ctx)
		} else {
			err = o.lease.Close(ctx)
		}
		if err != nil {
			t.Fatalf("owner %d release: %v", i, err)
		}
	}
}

func TestTryLockSameLockerTwice(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 10*time.Second)
	ctx := testCtx(t)
	lk, err := a.tryLock(ctx, "twice")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if _, err := a.tryLock(ctx, "twice"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock by the same Locker = %v, want ErrLocked", err)
	}
	if err := lk.Check(); err != nil || !keyExists(t, a.cli, lk.Key()) {
		t.Fatalf("first lock damaged by the second attempt: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	lk2, err := a.tryLock(ctx, "twice")
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d not above %d", lk2.Token(), lk.Token())
	}
}

func TestTryLockKeysDoNotCollide(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 10*time.Second)
	b := newOwner(t, srv, 10*time.Second)
	ctx := testCtx(t)
	// With a plain prefix+key layout, "a/" would be a prefix of "a/b/"
	// and the two locks would exclude each other.
	if _, err := a.tryLock(ctx, "a/b"); err != nil {
		t.Fatalf("TryLock a/b: %v", err)
	}
	if _, err := b.tryLock(ctx, "a"); err != nil {
		t.Fatalf("TryLock a while a/b is held: %v", err)
	}
	if _, err := a.tryLock(ctx, ""); err == nil {
		t.Fatal("TryLock of an empty key succeeded")
	}
}

// A partitioned owner goes quiet at its local deadline, before etcd
// expires its lease and lets the next owner in; the next owner's token is
// higher, and the resource refuses the stale owner's late write.
func TestPartitionedOwnerGoesQuietBeforeTakeover(t *testing.T) {
	srv := etcdtest.Start(t)
	var partitioned atomic.Bool
	cfg := srv.Config()
	partition := func() error {
		if partitioned.Load() {
			return status.Error(codes.Unavailable, "test partition")
		}
		return nil
	}
	// Both new keepalive streams (KeepAliveOnce) and the established one
	// (the Locker's session) fail once partitioned.
	cfg.DialOptions = []grpc.DialOption{grpc.WithChainStreamInterceptor(streamHook(keepAliveMethod,
		func(s grpc.ClientStream) grpc.ClientStream { return &failingStream{s, partition} },
		partition))}
	a := newOwnerWithClient(t, etcdtest.NewClient(t, cfg), 2*time.Second)
	b := newOwner(t, srv, 5*time.Second)
	ctx := testCtx(t)
	res := &fencedResource{}

	lkA, err := a.tryLock(ctx, "recovery/7")
	if err != nil {
		t.Fatalf("A TryLock: %v", err)
	}
	if err := res.Write(lkA.Token()); err != nil {
		t.Fatalf("A write: %v", err)
	}
	partitioned.Store(true) // A's keepalives (once and stream) now fail

	var lkB *Lock
	for giveUp := time.Now().Add(10 * time.Second); ; {
		lkB, err = b.tryLock(ctx, "recovery/7")
		if err == nil {
			break
		}
		if !errors.Is(err, ErrLocked) {
			t.Fatalf("B TryLock: %v", err)
		}
		if time.Now().After(giveUp) {
			t.Fatal("B never acquired the key after A was partitioned")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The moment B holds the key, A must already have stopped.
	if lkA.Valid() {
		t.Fatal("A's lock still Valid when B acquired the key")
	}
	if !isClosed(a.lease.Done()) {
		t.Fatal("A's lease Done not closed when B acquired the key")
	}
	if err := lkA.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("A Check = %v, want ErrLeaseExpired", err)
	}
	if lkB.Token() <= lkA.Token() {
		t.Fatalf("B token %d not above A token %d", lkB.Token(), lkA.Token())
	}
	if err := res.Write(lkB.Token()); err != nil {
		t.Fatalf("B write: %v", err)
	}
	// A write A had in flight (checked before the partition) lands late.
	if err := res.Write(lkA.Token()); !errors.Is(err, errStaleToken) {
		t.Fatalf("stale write from A = %v, want rejection", err)
	}
}

// Close without revoke (its revoke cannot be sent): the key stays held
// until etcd expires the lease, then the next owner gets a higher token.
func TestTakeoverAfterEtcdExpiresUnrevokedLease(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 2*time.Second)
	b := newOwner(t, srv, 5*time.Second)
	ctx := testCtx(t)
	lkA, err := a.tryLock(ctx, "unrevoked")
	if err != nil {
		t.Fatalf("A TryLock: %v", err)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.lease.Close(canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with a canceled context = %v, want context.Canceled", err)
	}
	closedAt := time.Now()
	if _, err := b.tryLock(ctx, "unrevoked"); !errors.Is(err, ErrLocked) {
		t.Fatalf("B TryLock right after A stopped = %v, want ErrLocked (etcd still has A's lease)", err)
	}
	var lkB *Lock
	for giveUp := time.Now().Add(10 * time.Second); ; {
		lkB, err = b.tryLock(ctx, "unrevoked")
		if err == nil {
			break
		}
		if !errors.Is(err, ErrLocked) {
			t.Fatalf("B TryLock: %v", err)
		}
		if time.Now().After(giveUp) {
			t.Fatal("B never acquired the key after A's lease expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waited := time.Since(closedAt); waited < time.Second {
		t.Fatalf("B acquired %v after A stopped; etcd should hold a 2s lease longer", waited)
	}
	if lkB.Token() <= lkA.Token() {
		t.Fatalf("B token %d not above A token %d", lkB.Token(), lkA.Token())
	}
}

func TestLockerClose(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 10*time.Second)
	ctx := testCtx(t)
	lk, err := a.tryLock(ctx, "locker-close")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := a.locker.Close(); err != nil {
		t.Fatalf("Locker Close: %v", err)
	}
	if _, err := a.tryLock(ctx, "other"); err == nil {
		t.Fatal("TryLock on a closed Locker succeeded")
	}
	// The lease and its lock are unaffected.
	if err := lk.Check(); err != nil {
		t.Fatalf("Check after Locker Close: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after Locker Close: %v", err)
	}
}

// The lease's deadline passes while the acquiring transaction is in
// flight: TryLock must not hand out the lock, and must release the key.
func TestTryLockLeaseExpiresDuringAcquire(t *testing.T) {
	srv := etcdtest.Start(t)
	clock := newFakeClock()
	var jump atomic.Bool
	cfg := srv.Config()
	cfg.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && jump.Load() {
				clock.Advance(time.Hour)
			}
			return err
		})}
	a := newOwnerWithClient(t, etcdtest.NewClient(t, cfg), 5*time.Second, WithClock(clock.Now))
	jump.Store(true)
	_, err := a.tryLock(testCtx(t), "slow")
	if !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("TryLock = %v, want ErrLeaseExpired", err)
	}
	admin := srv.Client(t)
	resp, err := admin.Get(testCtx(t), testPrefix+"slow/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d lock keys left behind, want 0", resp.Count)
	}
}

// failingStream fails every message while fail returns an error.
type failingStream struct {
	grpc.ClientStream
	fail func() error
}

func (s *failingStream) SendMsg(m any) error {
	if err := s.fail(); err != nil {
		return err
	}
	return s.ClientStream.SendMsg(m)
}

func (s *failingStream) RecvMsg(m any) error {
	if err := s.fail(); err != nil {
		return err
	}
	return s.ClientStream.RecvMsg(m)
}

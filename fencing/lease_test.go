package fencing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/idemcoord/idem/internal/etcdtest"
)

func TestGrantValidatesOptions(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := testCtx(t)
	cases := []struct {
		name string
		ttl  time.Duration
		opts []Option
	}{
		{"ttl below 1s", 500 * time.Millisecond, nil},
		{"negative margin", 5 * time.Second, []Option{WithMargin(-time.Second)}},
		{"margin equals ttl", 5 * time.Second, []Option{WithMargin(5 * time.Second)}},
		{"zero interval", 5 * time.Second, []Option{WithKeepAliveInterval(0)}},
		{"interval reaches deadline", 5 * time.Second, []Option{WithMargin(time.Second), WithKeepAliveInterval(4 * time.Second)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Grant(ctx, cli, tc.ttl, tc.opts...)
			if err == nil {
				_ = l.Close(ctx)
				t.Fatalf("Grant succeeded, want an error")
			}
		})
	}
	// No lease may have been granted by the failed calls.
	resp, err := cli.Leases(ctx)
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	if len(resp.Leases) != 0 {
		t.Fatalf("%d leases granted by invalid Grant calls, want 0", len(resp.Leases))
	}
}

func TestGrantDefaults(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	clock := newFakeClock()
	t0 := clock.Now()
	// 2.5s rounds up to 3s.
	l := grant(t, cli, 2500*time.Millisecond, WithClock(clock.Now))
	if got, want := l.TTL(), 3*time.Second; got != want {
		t.Fatalf("TTL = %v, want %v", got, want)
	}
	// The grant's send time starts the deadline; default margin TTL/5.
	if got, want := l.Deadline(), t0.Add(3*time.Second-600*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Deadline = %v, want grant send time + TTL - TTL/5 = %v", got, want)
	}
	if got, want := l.Remaining(), 2400*time.Millisecond; got != want {
		t.Fatalf("Remaining = %v, want %v", got, want)
	}
	ttl, err := cli.TimeToLive(testCtx(t), l.ID())
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	if ttl.GrantedTTL != 3 {
		t.Fatalf("etcd granted TTL %ds, want 3s", ttl.GrantedTTL)
	}
}

// The owner goes quiet at its local deadline with no help from etcd:
// etcd is stopped first, then the (fake) clock is moved to the deadline.
func TestLocalDeadlineWithoutEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	clock := newFakeClock()
	t0 := clock.Now()
	o := newOwnerWithClient(t, cli, 5*time.Second, WithClock(clock.Now))
	lk, err := o.tryLock(testCtx(t), "deadline")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	want := t0.Add(5*time.Second - time.Second)
	if got := o.lease.Deadline(); !got.Equal(want) {
		t.Fatalf("Deadline = %v, want %v", got, want)
	}

	// Close the lease (no revoke reaches etcd) at the end, before cleanup.
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = o.lease.Close(ctx)
	}()
	srv.Stop() // etcd is never asked again

	clock.Advance(want.Sub(clock.Now()) - time.Nanosecond)
	if !o.lease.Valid() || !lk.Valid() {
		t.Fatalf("invalid 1ns before the deadline")
	}
	if err := lk.Check(); err != nil {
		t.Fatalf("Check 1ns before the deadline: %v", err)
	}
	if got := o.lease.Remaining(); got != time.Nanosecond {
		t.Fatalf("Remaining = %v, want 1ns", got)
	}
	if isClosed(o.lease.Done()) {
		t.Fatalf("Done closed before the deadline")
	}

	clock.Advance(time.Nanosecond)
	if o.lease.Valid() {
		t.Fatalf("lease Valid at the deadline")
	}
	if lk.Valid() {
		t.Fatalf("lock Valid at the deadline")
	}
	if err := lk.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check at the deadline = %v, want ErrLeaseExpired", err)
	}
	if got := o.lease.Remaining(); got != 0 {
		t.Fatalf("Remaining = %v, want 0", got)
	}
	waitClosed(t, o.lease.Done(), time.Second, "Done")
	if _, err := o.tryLock(testCtx(t), "other"); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("TryLock on an expired lease = %v, want ErrLeaseExpired", err)
	}
	if _, err := NewLocker(cli, o.lease, testPrefix); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("NewLocker on an expired lease = %v, want ErrLeaseExpired", err)
	}
	// Dead for good, even if the clock went back.
	clock.Advance(-time.Hour)
	if o.lease.Valid() {
		t.Fatalf("lease revived")
	}
}

// Done closes by itself — its timer, with nobody calling Valid and no
// keepalive answered — when the clock jumps past the deadline. Before
// that, successful keepalives at a frozen clock leave the deadline put.
func TestDoneClosesOnItsOwnAfterClockJump(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	clock := newFakeClock()
	hook, attempts := keepAlives()
	l := grant(t, cli, 2*time.Second, WithClock(clock.Now), WithKeepAliveInterval(100*time.Millisecond), hook)
	deadline := l.Deadline()
	waitAttempts(t, attempts, 3, true) // keepalives at frozen time
	if !l.Deadline().Equal(deadline) {
		t.Fatalf("Deadline moved from %v to %v with a frozen clock", deadline, l.Deadline())
	}
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = l.Close(ctx)
	}()
	srv.Stop() // no keepalive succeeds from here on
	clock.Advance(time.Hour)
	if isClosed(l.Done()) {
		t.Fatal("Done closed before its timer could fire")
	}
	// The timer was last armed for the fake remaining time, 1.6s real.
	waitClosed(t, l.Done(), 5*time.Second, "Done")
	if err := l.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
}

// gatedRecv makes a keepalive round trip slow on the fake clock: the
// response is held until the test opens the gate, and the clock advances
// by delay before it is delivered.
type gatedRecv struct {
	grpc.ClientStream
	gate  <-chan struct{}
	clock *fakeClock
	delay time.Duration
	sends chan<- time.Time
}

func (s *gatedRecv) SendMsg(m any) error {
	select {
	case s.sends <- s.clock.Now():
	default:
	}
	return s.ClientStream.SendMsg(m)
}

func (s *gatedRecv) RecvMsg(m any) error {
	select {
	case <-s.gate:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	s.clock.Advance(s.delay)
	return s.ClientStream.RecvMsg(m)
}

// gatedClient returns a client whose keepalive responses wait at gate and
// advance clock by delay, and whose keepalive sends report the clock.
func gatedClient(t *testing.T, srv *etcdtest.Server, clock *fakeClock, delay time.Duration) (
	cli *clientv3.Client, gate chan<- struct{}, sends <-chan time.Time) {
	t.Helper()
	g := make(chan struct{}, 1)
	sc := make(chan time.Time, 16)
	cfg := srv.Config()
	cfg.DialOptions = []grpc.DialOption{grpc.WithChainStreamInterceptor(streamHook(keepAliveMethod,
		func(s grpc.ClientStream) grpc.ClientStream {
			return &gatedRecv{ClientStream: s, gate: g, clock: clock, delay: delay, sends: sc}
		}, nil))}
	return etcdtest.NewClient(t, cfg), g, sc
}

// sendAfter returns the send time of the first keepalive sent at or after
// from, skipping earlier ones (they time out at the gate).
func sendAfter(t *testing.T, sends <-chan time.Time, from time.Time) time.Time {
	t.Helper()
	giveUp := time.After(5 * time.Second)
	for {
		select {
		case sent := <-sends:
			if !sent.Before(from) {
				return sent
			}
		case <-giveUp:
			t.Fatalf("no keepalive sent at or after %v", from)
			return time.Time{}
		}
	}
}

func TestDeadlineFromKeepAliveSendTime(t *testing.T) {
	srv := etcdtest.Start(t)
	clock := newFakeClock()
	const delay = 700 * time.Millisecond
	cli, gate, sends := gatedClient(t, srv, clock, delay)

	const ttl, margin = 3 * time.Second, 600 * time.Millisecond
	hook, attempts := keepAlives()
	l := grant(t, cli, ttl, WithClock(clock.Now), WithMargin(margin),
		WithKeepAliveInterval(50*time.Millisecond), hook)
	initial := l.Deadline()

	// Time passes before the first keepalive is sent.
	sent := sendAfter(t, sends, clock.Advance(time.Second))
	if want := initial.Add(time.Second - (ttl - margin)); !sent.Equal(want) {
		t.Fatalf("keepalive sent at %v, want %v", sent, want)
	}
	gate <- struct{}{} // deliver one response, 700ms (fake) after sending

	waitAttempts(t, attempts, 1, true)
	received := sent.Add(delay)
	if got, want := l.Deadline(), sent.Add(ttl-margin); !got.Equal(want) {
		t.Fatalf("Deadline = %v, want send time + TTL - margin = %v (receive-time based would be %v)",
			got, want, received.Add(ttl-margin))
	}
	if now := clock.Now(); !now.Equal(received) {
		t.Fatalf("clock = %v, want %v (the round trip took %v)", now, received, delay)
	}
	// Later attempts are held at the gate and time out: no more renewals.
	waitAttempts(t, attempts, 3, false)
	if got, want := l.Deadline(), sent.Add(ttl-margin); !got.Equal(want) {
		t.Fatalf("Deadline moved to %v without a response, want %v", got, want)
	}
	if !l.Valid() {
		t.Fatal("lease invalid before its deadline")
	}
}

// A keepalive sent before the deadline whose response arrives after it
// does not revive the lease: the owner may already have gone quiet.
func TestLateKeepAliveDoesNotRevive(t *testing.T) {
	srv := etcdtest.Start(t)
	clock := newFakeClock()
	cli, gate, sends := gatedClient(t, srv, clock, time.Second)
	hook, attempts := keepAlives()
	l := grant(t, cli, 3*time.Second, WithClock(clock.Now), WithKeepAliveInterval(50*time.Millisecond), hook)
	deadline := l.Deadline() // t0 + 2.4s

	sent := sendAfter(t, sends, clock.Advance(2*time.Second))
	if !sent.Before(deadline) {
		t.Fatalf("keepalive sent at %v, not before the deadline %v", sent, deadline)
	}
	gate <- struct{}{} // the response lands 1s later, past the deadline

	waitAttempts(t, attempts, 1, true) // the late response, applied
	if got := l.Deadline(); !got.Equal(deadline) {
		t.Fatalf("late response moved the deadline from %v to %v", deadline, got)
	}
	if !isClosed(l.Done()) || l.Valid() {
		t.Fatal("lease alive after a renewal that landed past its deadline")
	}
}

// With the real clock and etcd gone, the lease stays valid until its
// local deadline and not a moment longer.
func TestLocalDeadlineRealClockEtcdStopped(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	hook, attempts := keepAlives()
	// A TTL long enough that a loaded machine still stops etcd before
	// the deadline; the default margin is TTL/5.
	const ttl = 4 * time.Second
	l := grant(t, cli, ttl, WithKeepAliveInterval(100*time.Millisecond), hook)
	waitAttempts(t, attempts, 1, true) // the deadline now comes from a keepalive
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = l.Close(ctx)
	}()
	srv.Stop()
	stopped := time.Now()
	if !l.Valid() {
		t.Fatal("lease invalid right after etcd stopped")
	}
	deadline := l.Deadline()
	if d := deadline.Sub(stopped); d <= 0 || d > ttl-ttl/5 {
		t.Fatalf("deadline %v after etcd stopped, want in (0, TTL-margin]", d)
	}
	// Valid compares the clock with the deadline itself: false from the
	// deadline on, however late the timer that closes Done fires.
	time.Sleep(time.Until(deadline))
	if l.Valid() {
		t.Fatalf("lease valid at %v, its deadline %v has passed", time.Now(), deadline)
	}
	waitClosed(t, l.Done(), 5*time.Second, "Done")
	if closed := time.Now(); closed.Before(deadline) {
		t.Fatalf("Done closed %v before the deadline", deadline.Sub(closed))
	}
	if err := l.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
}

func TestLeaseRevokedExternally(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 5*time.Second, WithKeepAliveInterval(100*time.Millisecond))
	lk, err := a.tryLock(testCtx(t), "revoked")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	admin := srv.Client(t)
	if _, err := admin.Revoke(testCtx(t), a.lease.ID()); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	waitClosed(t, a.lease.Done(), 3*time.Second, "Done after external revoke")
	if a.lease.Valid() {
		t.Fatal("lease Valid after external revoke")
	}
	if time.Until(a.lease.Deadline()) <= 0 {
		t.Fatal("test too slow: deadline passed, cannot tell loss from expiry")
	}
	if err := a.lease.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("lease Check = %v, want ErrLeaseExpired", err)
	}
	if err := lk.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("lock Check = %v, want ErrLeaseExpired", err)
	}
	// The revoke deleted the lock key, so a second owner gets the key at
	// once, with a higher token.
	b := newOwner(t, srv, 5*time.Second)
	lk2, err := b.tryLock(testCtx(t), "revoked")
	if err != nil {
		t.Fatalf("second owner TryLock: %v", err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("second token %d not above first %d", lk2.Token(), lk.Token())
	}
	if err := lk.Unlock(testCtx(t)); err != nil {
		t.Fatalf("Unlock of a lost lock: %v", err)
	}
	if !keyExists(t, admin, lk2.Key()) {
		t.Fatal("stale Unlock deleted the new owner's key")
	}
}

func TestLeaseCloseRevokes(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newOwner(t, srv, 30*time.Second)
	lk, err := a.tryLock(testCtx(t), "closed")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := a.lease.Close(testCtx(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !isClosed(a.lease.Done()) || a.lease.Valid() || lk.Valid() {
		t.Fatal("lease or lock still alive after Close")
	}
	if err := lk.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
	if err := a.lease.Close(testCtx(t)); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	admin := srv.Client(t)
	ttl, err := admin.TimeToLive(testCtx(t), a.lease.ID())
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	if ttl.TTL != -1 {
		t.Fatalf("lease TTL in etcd %d after Close, want -1 (revoked)", ttl.TTL)
	}
	if keyExists(t, admin, lk.Key()) {
		t.Fatal("lock key survived the revoke")
	}
	// A 30s lease would block for 30s had it not been revoked.
	b := newOwner(t, srv, 5*time.Second)
	if _, err := b.tryLock(testCtx(t), "closed"); err != nil {
		t.Fatalf("TryLock after Close: %v", err)
	}
}

// Closing the client ends the lease locally at once (it can no longer be
// renewed), while etcd keeps it until its TTL runs out.
func TestClientCloseEndsLease(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	l := grant(t, cli, 5*time.Second)
	if err := cli.Close(); err != nil {
		t.Fatalf("client Close: %v", err)
	}
	waitClosed(t, l.Done(), 3*time.Second, "Done after client Close")
	if err := l.Check(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Check = %v, want ErrLeaseExpired", err)
	}
	if err := l.Close(testCtx(t)); err == nil {
		t.Fatal("Close revoked through a closed client")
	}
	ttl, err := srv.Client(t).TimeToLive(testCtx(t), l.ID())
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	if ttl.TTL <= 0 {
		t.Fatalf("lease gone from etcd (TTL %d); only its owner's client closed", ttl.TTL)
	}
}

// Many goroutines read the lease while it renews and dies.
func TestLeaseConcurrentReaders(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	clock := newFakeClock()
	hook, attempts := keepAlives()
	l := grant(t, cli, 2*time.Second, WithClock(clock.Now), WithKeepAliveInterval(20*time.Millisecond), hook)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = l.Valid()
				_ = l.Remaining()
				_ = l.Deadline()
				_ = l.Check()
			}
		})
	}
	waitAttempts(t, attempts, 5, true) // renewals while they read
	clock.Advance(time.Hour)
	waitClosed(t, l.Done(), 5*time.Second, "Done")
	close(stop)
	wg.Wait()
}

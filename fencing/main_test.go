package fencing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/idemcoord/idem/internal/etcdtest"
)

// TestMain starts the etcd the examples use and fails the package if any
// goroutine (ours, the etcd clients' or the test etcd's relays) outlives
// the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withExampleEtcd{m})
}

// ExampleEndpoints are the client URLs of the etcd member TestMain starts
// for the examples (a service passes its own etcd cluster's).
var ExampleEndpoints []string

// withExampleEtcd runs the tests with an etcd member for the examples.
type withExampleEtcd struct{ m *testing.M }

func (w withExampleEtcd) Run() int {
	bin, err := etcdtest.Binary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fencing tests:", err)
		return 1
	}
	srv, err := etcdtest.New(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fencing tests:", err)
		return 1
	}
	defer srv.Stop()
	ExampleEndpoints = srv.Endpoints
	return w.m.Run()
}

const (
	testPrefix = "idem/test/locks/"
	// closeTimeout bounds the revoke in a lease's cleanup.
	closeTimeout = 2 * time.Second
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// grant grants a lease closed in t.Cleanup (before its client closes).
func grant(t *testing.T, cli *clientv3.Client, ttl time.Duration, opts ...Option) *Lease {
	t.Helper()
	l, err := Grant(testCtx(t), cli, ttl, opts...)
	if err != nil {
		t.Fatalf("Grant(%v): %v", ttl, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// owner is one contender: its own client, lease and locker.
type owner struct {
	cli    *clientv3.Client
	lease  *Lease
	locker *Locker
}

func newOwner(t *testing.T, srv *etcdtest.Server, ttl time.Duration, opts ...Option) *owner {
	t.Helper()
	return newOwnerWithClient(t, srv.Client(t), ttl, opts...)
}

func newOwnerWithClient(t *testing.T, cli *clientv3.Client, ttl time.Duration, opts ...Option) *owner {
	t.Helper()
	l := grant(t, cli, ttl, opts...)
	lk, err := NewLocker(cli, l, testPrefix)
	if err != nil {
		t.Fatalf("NewLocker: %v", err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return &owner{cli: cli, lease: l, locker: lk}
}

// tryLock is o.locker.TryLock, with the lock as the *Lock it is.
func (o *owner) tryLock(ctx context.Context, key string) (*Lock, error) {
	lk, err := o.locker.TryLock(ctx, key)
	if err != nil {
		return nil, err
	}
	return lk.(*Lock), nil
}

// createRevision reads key's create revision and lease, failing if absent.
func createRevision(t *testing.T, cli *clientv3.Client, key string) (rev int64, lease clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(testCtx(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("Get(%q): %d keys, want 1", key, len(resp.Kvs))
	}
	return resp.Kvs[0].CreateRevision, clientv3.LeaseID(resp.Kvs[0].Lease)
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(testCtx(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return len(resp.Kvs) > 0
}

// waitClosed fails the test unless ch closes within d.
func waitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s not closed within %v", what, d)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// fakeClock is a manually advanced clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// fencedResource is what a store row or provider does with tokens: it
// remembers the highest token seen and refuses lower ones.
type fencedResource struct {
	mu     sync.Mutex
	max    int64
	writes []int64
}

var errStaleToken = errors.New("stale fencing token")

func (r *fencedResource) Write(token int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.max {
		return errStaleToken
	}
	r.max = token
	r.writes = append(r.writes, token)
	return nil
}

// keepAliveMethod is the gRPC method of lease keepalives (stream and once).
const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// streamHook wraps the client streams of one gRPC method.
func streamHook(method string, wrap func(grpc.ClientStream) grpc.ClientStream,
	fail func() error) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, m string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if m != method {
			return streamer(ctx, desc, cc, m, opts...)
		}
		if fail != nil {
			if err := fail(); err != nil {
				return nil, err
			}
		}
		s, err := streamer(ctx, desc, cc, m, opts...)
		if err != nil || wrap == nil {
			return s, err
		}
		return wrap(s), nil
	}
}

// keepAlives returns an option that reports each keepalive attempt's
// error, once the lease has applied it, on the returned channel: tests
// wait for attempts instead of sleeping through them.
func keepAlives() (Option, <-chan error) {
	ch := make(chan error, 1024)
	return func(o *options) {
		o.attempted = func(err error) {
			select {
			case ch <- err:
			default:
			}
		}
	}, ch
}

// waitAttempts waits for n keepalive attempts that succeeded (ok) or
// failed (!ok), skipping the others.
func waitAttempts(t *testing.T, attempts <-chan error, n int, ok bool) {
	t.Helper()
	giveUp := time.After(10 * time.Second)
	for n > 0 {
		select {
		case err := <-attempts:
			if (err == nil) == ok {
				n--
			}
		case <-giveUp:
			t.Fatalf("%d more keepalive attempts (succeeded: %v) never came", n, ok)
		}
	}
}

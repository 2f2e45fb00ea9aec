package fencing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/idemcoord/idem"
)

// ErrLocked is returned (wrapped) by TryLock when another owner holds the
// key. It wraps idem.ErrLocked, the error the engine's Locker contract
// names. When etcd reported the conflict the error also wraps
// concurrency.ErrLocked.
var ErrLocked = fmt.Errorf("fencing: %w", idem.ErrLocked)

// ErrReleased is returned by Lock.Check after Unlock.
var ErrReleased = errors.New("fencing: lock released")

// cleanupTimeout bounds best-effort deletes of a lock key after a failed
// or abandoned acquisition.
const cleanupTimeout = 5 * time.Second

// Locker takes per-key ownership under one Lease. It satisfies the
// engine's and payments' Locker interfaces.
//
// Use one Locker per (Lease, prefix): locks are keyed by lease, so two
// Lockers sharing both would share ownership of each key. A Locker is safe
// for concurrent use.
type Locker struct {
	lease   *Lease
	prefix  string
	session *concurrency.Session
	closed  atomic.Bool

	mu   sync.Mutex
	held map[string]bool // etcd keys of live Locks and in-flight TryLocks
}

// NewLocker returns a Locker whose locks live under prefix (conventionally
// ending in "/") and are held by lease. cli is normally the client the
// lease was granted on.
//
// It builds a concurrency.Session on the existing lease
// (concurrency.WithLease). Who closes what: the caller keeps owning cli
// and lease and closes cli last; the session never revokes the lease, and
// its keepalive stream (which only ever extends etcd's expiry, never the
// local deadline) ends when the lease dies or is closed, or on
// Locker.Close. Closing the Lease (or its death) therefore also ends the
// Locker; its held locks are released by Unlock or by the lease ending.
func NewLocker(cli *clientv3.Client, lease *Lease, prefix string) (*Locker, error) {
	if cli == nil || lease == nil {
		return nil, errors.New("fencing: new locker: nil client or lease")
	}
	if err := lease.Check(); err != nil {
		return nil, fmt.Errorf("fencing: new locker: %w", err)
	}
	s, err := concurrency.NewSession(cli,
		concurrency.WithLease(lease.ID()),
		concurrency.WithContext(lease.ctx))
	if err != nil {
		return nil, fmt.Errorf("fencing: new locker: session on lease %x: %w", int64(lease.ID()), err)
	}
	return &Locker{lease: lease, prefix: prefix, session: s, held: make(map[string]bool)}, nil
}

// Close ends the Locker's session keepalive stream; TryLock then fails.
// It neither revokes the lease nor releases held locks (Unlock them, or
// close the Lease). It is idempotent.
func (l *Locker) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		l.session.Orphan()
	}
	return nil
}

// TryLock takes key if nobody holds it, without waiting. It returns
// ErrLocked if another owner (or another Lock of this Locker) holds it,
// and ErrLeaseExpired if the lease is not Valid before or after acquiring
// (in the latter case the key is released again, best effort).
//
// The lock's etcd key is prefix + url.PathEscape(key) + "/" + lease ID in
// hex (concurrency.Mutex layout), so keys containing "/" cannot collide
// with one another. If a previous attempt of this Locker on the same key
// failed ambiguously and left its etcd key behind, TryLock adopts it; the
// token is then that key's create revision, which is still higher than
// every earlier owner's.
//
// The idem.Lock it returns is a *Lock: it is an interface so that
// consumers (package engine) need not import this package and the etcd
// client.
func (l *Locker) TryLock(ctx context.Context, key string) (idem.Lock, error) {
	if key == "" {
		return nil, errors.New("fencing: trylock: empty key")
	}
	if l.closed.Load() {
		return nil, fmt.Errorf("fencing: trylock %q: locker closed", key)
	}
	if err := l.lease.Check(); err != nil {
		return nil, fmt.Errorf("fencing: trylock %q: %w", key, err)
	}

	m := concurrency.NewMutex(l.session, l.prefix+url.PathEscape(key))
	// m.Key() is only set by TryLock; compute ours to reserve it locally.
	etcdKey := fmt.Sprintf("%s%s/%x", l.prefix, url.PathEscape(key), int64(l.lease.ID()))
	if !l.reserve(etcdKey) {
		return nil, fmt.Errorf("%w: key %q is already held by this locker", ErrLocked, key)
	}
	lk, err := l.acquire(ctx, m, key, etcdKey)
	if err != nil {
		l.unreserve(etcdKey)
		return nil, err
	}
	return lk, nil
}

func (l *Locker) acquire(ctx context.Context, m *concurrency.Mutex, key, etcdKey string) (*Lock, error) {
	if err := m.TryLock(ctx); err != nil {
		if errors.Is(err, concurrency.ErrLocked) {
			return nil, fmt.Errorf("%w: key %q: %w", ErrLocked, key, err)
		}
		// Ambiguous: our key may have been written. Nobody in this
		// Locker holds it (we reserved it), so remove it.
		l.cleanup(ctx, etcdKey, 0)
		return nil, fmt.Errorf("fencing: trylock %q: %w", key, err)
	}
	if m.Key() != etcdKey {
		l.cleanup(ctx, m.Key(), 0)
		return nil, fmt.Errorf("fencing: trylock %q: mutex key %q, want %q", key, m.Key(), etcdKey)
	}

	// The header revision of the acquiring txn is our key's create
	// revision when the txn created it; read the key to be sure (and to
	// cover adoption of a key left by an earlier failed attempt).
	resp, err := l.session.Client().Get(ctx, etcdKey)
	if err != nil {
		l.cleanup(ctx, etcdKey, 0)
		return nil, fmt.Errorf("fencing: trylock %q: read lock key: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		// Deleted between the txn and the read: the lease ended in etcd.
		return nil, fmt.Errorf("%w: trylock %q: lock key vanished after acquiring (lease %x gone)",
			ErrLeaseExpired, key, int64(l.lease.ID()))
	}
	kv := resp.Kvs[0]
	if clientv3.LeaseID(kv.Lease) != l.lease.ID() {
		return nil, fmt.Errorf("fencing: trylock %q: lock key %q bound to lease %x, want %x",
			key, etcdKey, kv.Lease, int64(l.lease.ID()))
	}
	token := kv.CreateRevision

	if err := l.lease.Check(); err != nil {
		l.cleanup(ctx, etcdKey, token)
		return nil, fmt.Errorf("fencing: trylock %q: %w", key, err)
	}
	return &Lock{locker: l, name: key, key: etcdKey, token: token}, nil
}

// cleanup deletes etcdKey, best effort; if token is non-zero only while
// its create revision is token.
func (l *Locker) cleanup(ctx context.Context, etcdKey string, token int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	txn := l.session.Client().Txn(ctx)
	if token != 0 {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(etcdKey), "=", token))
	}
	_, _ = txn.Then(clientv3.OpDelete(etcdKey)).Commit()
}

func (l *Locker) reserve(etcdKey string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[etcdKey] {
		return false
	}
	l.held[etcdKey] = true
	return true
}

func (l *Locker) unreserve(etcdKey string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, etcdKey)
}

// Lock is ownership of one key, fenced by Token; it implements idem.Lock.
// Its methods are safe for concurrent use.
type Lock struct {
	locker   *Locker
	name     string
	key      string
	token    int64
	released atomic.Bool
}

var _ idem.Lock = (*Lock)(nil)

// Token returns the fencing token: the create revision of the lock's etcd
// key. Successive owners of a key get strictly increasing tokens. Every
// write made under the lock must carry it, and the resource must reject
// writes with a token lower than the highest it has seen.
func (k *Lock) Token() int64 { return k.token }

// Key returns the lock's etcd key (see Locker.TryLock for its layout).
func (k *Lock) Key() string { return k.key }

// Valid reports whether the lock may still be used: it was not unlocked
// and its lease's local deadline has not passed (nor was the lease lost or
// closed).
func (k *Lock) Valid() bool { return k.Check() == nil }

// Check returns nil while the lock is Valid; otherwise an error wrapping
// ErrLeaseExpired, or ErrReleased after Unlock. Owners call it before
// each write or side effect, and stop on error.
func (k *Lock) Check() error {
	if k.released.Load() {
		return fmt.Errorf("fencing: lock %q: %w", k.name, ErrReleased)
	}
	if err := k.locker.lease.Check(); err != nil {
		return fmt.Errorf("fencing: lock %q: %w", k.name, err)
	}
	return nil
}

// Unlock releases the key: it deletes the lock's etcd key if it is still
// ours (same create revision). The lock is invalid from the moment Unlock
// is called, whatever it returns. If the delete fails, the key stays held
// until the lease ends, or until this Locker's next TryLock of the same key
// adopts it. Calls after the first return nil.
func (k *Lock) Unlock(ctx context.Context) error {
	if !k.released.CompareAndSwap(false, true) {
		return nil
	}
	defer k.locker.unreserve(k.key)
	cmp := clientv3.Compare(clientv3.CreateRevision(k.key), "=", k.token)
	_, err := k.locker.session.Client().Txn(ctx).If(cmp).Then(clientv3.OpDelete(k.key)).Commit()
	if err != nil {
		return fmt.Errorf("fencing: unlock %q: %w", k.name, err)
	}
	// Not succeeded: the key is already gone (the lease ended).
	return nil
}

package fencing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrLeaseExpired is returned (wrapped, with the reason) once a Lease is
// no longer valid: its local deadline passed without renewal, etcd no
// longer knows it, its client was closed, or it was closed. Owners must
// stop writing when they see it.
var ErrLeaseExpired = errors.New("fencing: lease expired")

// Option configures Grant.
type Option func(*options)

type options struct {
	now         func() time.Time
	margin      time.Duration
	marginSet   bool
	interval    time.Duration
	intervalSet bool
	// attempted, when set, is called after each keepalive attempt has
	// been applied, with its error: tests wait on it instead of sleeping.
	attempted func(error)
}

// WithClock replaces the clock used for the local deadline. The default is
// time.Now, whose monotonic reading makes the deadline immune to wall-clock
// steps. Tests inject a fake clock; a nil now keeps the default. The clock
// must be safe for concurrent use and must not call back into the Lease.
//
// Only the deadline arithmetic uses it: keepalive pacing, RPC timeouts and
// the timer that closes Done run on real time, and Done re-checks the
// injected clock whenever that timer fires (and whenever Valid, Check or
// Remaining observe the deadline passing).
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// WithMargin sets how long before the earliest possible etcd expiry the
// owner stops: Deadline = last keepalive send time + TTL - margin. The
// default is TTL/5, which tolerates a 20% clock-rate difference between
// this process and the etcd leader. It must be at least 0 and less than
// the TTL.
func WithMargin(d time.Duration) Option {
	return func(o *options) {
		o.margin, o.marginSet = d, true
	}
}

// WithKeepAliveInterval sets how often the lease is renewed. The default is
// TTL/3. It must be positive and less than TTL - margin, so that a renewal
// is attempted before the local deadline; after a failed attempt the next
// one comes after a quarter of the interval.
func WithKeepAliveInterval(d time.Duration) Option {
	return func(o *options) {
		o.interval, o.intervalSet = d, true
	}
}

// Lease is an etcd lease kept alive by this process, with a local deadline
// after which the process must consider it lost without asking etcd.
//
// A Lease is safe for concurrent use. It dies once (see the package doc)
// and is never revived.
type Lease struct {
	cli      *clientv3.Client
	id       clientv3.LeaseID
	ttl      time.Duration
	margin   time.Duration
	interval time.Duration
	now      func() time.Time
	// attempted: see options.attempted.
	attempted func(error)

	// ctx is canceled when the lease dies; it bounds keepalive calls and
	// the keepalive streams of Lockers' sessions.
	ctx      context.Context
	cancel   context.CancelCauseFunc
	loopDone chan struct{}

	closeOnce sync.Once

	mu       sync.Mutex
	deadline time.Time
	err      error // non-nil once dead; wraps ErrLeaseExpired
	timer    *time.Timer
	done     chan struct{}
}

// Grant grants an etcd lease of the given TTL and keeps it alive from a
// goroutine until the lease dies or Close is called.
//
// etcd leases have whole-second TTLs: ttl must be at least one second and
// is rounded up to whole seconds, and etcd may raise it to its minimum
// (1.5 election timeouts); TTL reports what etcd granted, and the default
// margin and keepalive interval derive from it. The grant request's send
// time starts the first local deadline.
//
// Each keepalive records sent := now() before calling
// cli.KeepAliveOnce, and on success moves the deadline to sent + TTL -
// margin: etcd renews no earlier than it receives the request, so etcd's
// expiry is never before that (up to clock-rate drift, which the margin
// absorbs). If etcd answers that the lease does not exist, the lease is
// lost for good and Done closes. Transient failures (etcd unreachable, no
// leader, timeouts) are retried until the local deadline passes.
//
// ctx bounds only the grant request; the keepalive goroutine lives until
// Close or the lease's death. Closing cli kills the lease locally at once
// (it can no longer be renewed); etcd then expires it after its TTL.
func Grant(ctx context.Context, cli *clientv3.Client, ttl time.Duration, opts ...Option) (*Lease, error) {
	if cli == nil {
		return nil, errors.New("fencing: grant: nil etcd client")
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if ttl < time.Second {
		return nil, fmt.Errorf("fencing: grant: TTL %v is below etcd's minimum of 1s", ttl)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	// etcd only ever raises the TTL, so limits that hold for the requested
	// TTL hold for the granted one.
	if err := o.validate(time.Duration(secs) * time.Second); err != nil {
		return nil, err
	}

	sent := o.now()
	resp, err := cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("fencing: grant lease: %w", err)
	}
	granted := time.Duration(resp.TTL) * time.Second
	margin, interval := o.margin, o.interval
	if !o.marginSet {
		margin = granted / 5
	}
	if !o.intervalSet {
		interval = granted / 3
	}

	lctx, cancel := context.WithCancelCause(cli.Ctx())
	l := &Lease{
		cli:       cli,
		id:        resp.ID,
		ttl:       granted,
		margin:    margin,
		interval:  interval,
		now:       o.now,
		attempted: o.attempted,
		ctx:       lctx,
		cancel:    cancel,
		loopDone:  make(chan struct{}),
		deadline:  sent.Add(granted - margin),
		done:      make(chan struct{}),
	}
	l.mu.Lock()
	l.timer = time.AfterFunc(l.deadline.Sub(l.now()), l.onTimer)
	l.mu.Unlock()
	go l.keepAlive()
	return l, nil
}

func (o *options) validate(ttl time.Duration) error {
	margin, interval := o.margin, o.interval
	if !o.marginSet {
		margin = ttl / 5
	}
	if !o.intervalSet {
		interval = ttl / 3
	}
	if margin < 0 || margin >= ttl {
		return fmt.Errorf("fencing: grant: margin %v must be in [0, TTL %v)", margin, ttl)
	}
	if interval <= 0 || interval >= ttl-margin {
		return fmt.Errorf("fencing: grant: keepalive interval %v must be in (0, TTL-margin %v)", interval, ttl-margin)
	}
	return nil
}

// ID returns the etcd lease ID.
func (l *Lease) ID() clientv3.LeaseID { return l.id }

// TTL returns the TTL etcd granted.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Deadline returns the local deadline: the send time of the last
// successful keepalive (or of the grant) + TTL - margin. It is not moved
// when the lease dies early (lost or closed); use Valid for that.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Valid reports whether the lease is alive: now() is before Deadline and
// the lease was not lost or closed. Once false it stays false.
func (l *Lease) Valid() bool { return l.Check() == nil }

// Check returns nil while the lease is Valid, and otherwise an error
// wrapping ErrLeaseExpired that says why.
func (l *Lease) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkLocked()
}

// Remaining returns how long until the local deadline, or 0 once the
// lease is no longer valid.
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checkLocked() != nil {
		return 0
	}
	return l.deadline.Sub(l.now())
}

// Done returns a channel that is closed when the lease dies: its local
// deadline passed without renewal, etcd reported it gone, its client was
// closed, or Close was called.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Close stops the keepalive goroutine, marks the lease dead (closing Done
// and failing every Lock under it), then revokes the lease in etcd so that
// its locks are released at once. Revocation is best effort: if it fails
// (ctx ends, etcd unreachable) the error is returned and etcd expires the
// lease within one TTL. A lease etcd no longer knows counts as revoked.
// Calls after the first return nil.
func (l *Lease) Close(ctx context.Context) error {
	first := false
	l.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	l.kill(fmt.Errorf("%w: lease %x closed", ErrLeaseExpired, int64(l.id)))
	<-l.loopDone
	if err := l.cli.Ctx().Err(); err != nil {
		// A closed client would only retry until ctx ends.
		return fmt.Errorf("fencing: revoke lease %x: etcd client closed: %w", int64(l.id), err)
	}
	if _, err := l.cli.Revoke(ctx, l.id); err != nil && !isLeaseNotFound(err) {
		return fmt.Errorf("fencing: revoke lease %x: %w", int64(l.id), err)
	}
	return nil
}

// checkLocked returns the lease's error, killing it first if the local
// deadline has passed. l.mu must be held.
func (l *Lease) checkLocked() error {
	if l.err != nil {
		return l.err
	}
	if now := l.now(); !now.Before(l.deadline) {
		l.killLocked(fmt.Errorf("%w: local deadline %v passed without renewal (now %v)",
			ErrLeaseExpired, l.deadline, now))
	}
	return l.err
}

func (l *Lease) kill(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.killLocked(err)
}

// killLocked marks the lease dead with err unless it already is. l.mu must
// be held.
func (l *Lease) killLocked(err error) {
	if l.err != nil {
		return
	}
	l.err = err
	l.timer.Stop()
	close(l.done)
	l.cancel(err)
}

// onTimer runs when the real-time timer armed for the local deadline
// fires. With an injected clock the deadline may not have passed yet;
// then the timer is re-armed for what remains.
func (l *Lease) onTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checkLocked() != nil {
		return
	}
	l.timer.Reset(l.deadline.Sub(l.now()))
}

// renewed records a successful keepalive sent at sent that renewed the
// lease for ttl.
func (l *Lease) renewed(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A renewal that lands after the deadline passed does not revive the
	// lease: the owner may already have gone quiet and Done is closed.
	if l.checkLocked() != nil {
		return
	}
	if d := sent.Add(ttl - l.margin); d.After(l.deadline) {
		l.deadline = d
	}
	l.timer.Reset(l.deadline.Sub(l.now()))
}

// keepAlive renews the lease every interval until l.ctx ends.
func (l *Lease) keepAlive() {
	defer close(l.loopDone)
	t := time.NewTimer(l.interval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			// Close or the deadline already killed the lease; otherwise
			// the client was closed and the lease cannot be renewed.
			l.kill(fmt.Errorf("%w: keepalive stopped: etcd client closed", ErrLeaseExpired))
			return
		case <-t.C:
		}

		sent := l.now()
		actx, cancel := context.WithTimeout(l.ctx, l.interval)
		resp, err := l.cli.KeepAliveOnce(actx, l.id)
		cancel()

		wait := l.interval
		switch {
		case err == nil:
			l.renewed(sent, time.Duration(resp.TTL)*time.Second)
		case isLeaseNotFound(err):
			l.kill(fmt.Errorf("%w: lease %x not found in etcd (revoked or expired): %w",
				ErrLeaseExpired, int64(l.id), err))
		default:
			// Transient (etcd unreachable, no leader, timeout): retry
			// sooner. The local deadline keeps the owner safe meanwhile.
			wait = l.interval / 4
		}
		if l.attempted != nil {
			l.attempted(err)
		}
		if isLeaseNotFound(err) {
			return
		}
		t.Reset(wait)
	}
}

// isLeaseNotFound reports whether err says etcd does not know the lease.
func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) ||
		errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound)
}

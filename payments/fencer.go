package payments

import (
	"context"
	"errors"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fencing"
)

// Locker takes recovery ownership of a key in an external lock service;
// *fencing.Locker satisfies it. A Lock's Token is its etcd create revision.
type Locker interface {
	TryLock(ctx context.Context, key string) (*fencing.Lock, error)
}

// errNeedsLock: the record must be recovered, and recovery takes the scope's
// external lock first.
var errNeedsLock = errors.New("payments: recovery needs the scope's lock")

// LockKey is the lock name of a scope under the locker's prefix:
// <tenant>/<operation>/<key>, each part path-escaped. It is the engine's
// (engine.LockKey), so that a takeover by Create and one by the engine's
// recovery fence each other.
func LockKey(scope idem.Scope) string { return engine.LockKey(scope) }

// lockScope takes the scope's recovery lock. A lock held by someone else is
// answered as in progress.
func (s *Service) lockScope(ctx context.Context, scope idem.Scope) (*fencing.Lock, error) {
	lock, err := s.cfg.Locker.TryLock(ctx, LockKey(scope))
	switch {
	case errors.Is(err, fencing.ErrLocked):
		return nil, &idem.Error{Code: idem.ECodeInProgress, Message: "Another owner is recovering this request; retry later.", Err: err}
	case err != nil:
		return nil, &idem.Error{Code: idem.ECodeUnavailable, Message: "The recovery lock service is unavailable; retry with the same key.", Err: err}
	}
	return lock, nil
}

// withLock runs attempt; when it needs the scope's lock, it takes the lock,
// runs attempt again with the lock's token and releases the lock after.
func (s *Service) withLock(ctx context.Context, begin idem.BeginRequest, attempt func(idem.BeginRequest, *fencing.Lock) (Result, error)) (Result, error) {
	res, err := attempt(begin, nil)
	if !errors.Is(err, errNeedsLock) {
		return res, err
	}
	lock, err := s.lockScope(ctx, begin.Scope)
	if err != nil {
		return Result{Outcome: idem.OutcomeInProgress}, err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = lock.Unlock(uctx)
	}()
	begin.FencingToken = lock.Token()
	return attempt(begin, lock)
}

// lockGuard is what an owner holding lock calls before a side effect; nil
// without a lock.
func lockGuard(lock *fencing.Lock) func() error {
	if lock == nil {
		return nil
	}
	return func() error { return checkLock(lock) }
}

// checkLock reports a lock whose local deadline has passed as in progress.
func checkLock(lock *fencing.Lock) error {
	if lock == nil {
		return nil
	}
	if err := lock.Check(); err != nil {
		return &idem.Error{Code: idem.ECodeInProgress, Message: "This owner's lease ran out; another owner will finish the request.", Err: err}
	}
	return nil
}

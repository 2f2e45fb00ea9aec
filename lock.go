package idem

import (
	"context"
	"errors"
)

// Lock is exclusive ownership of one key in an external lock service,
// fenced by a token: what a recoverer holds while it takes a record over.
// Package fencing's etcd Locker returns one; the engine's Locker interface
// returns one, so that the engine and the operations over it do not depend
// on the lock service's client. Its methods are safe for concurrent use.
type Lock interface {
	// Token is the fencing token: successive owners of a key get strictly
	// increasing tokens, and a write made under the lock carries it.
	Token() int64
	// Check returns nil while the lock may still be used; the owner calls
	// it before each write or side effect, and stops on error.
	Check() error
	// Unlock releases the key. The lock is invalid from the moment Unlock
	// is called, whatever it returns; calls after the first return nil.
	Unlock(ctx context.Context) error
}

// ErrLocked is wrapped by the error a Locker's TryLock returns when another
// owner holds the key; any other error means the lock service did not
// answer. Checked with errors.Is.
var ErrLocked = errors.New("locked by another owner")

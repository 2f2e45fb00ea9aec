package payments

import (
	"context"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// Locker takes recovery ownership of a key in an external lock service;
// *fencing.Locker satisfies it. A Lock's Token is its etcd create revision.
// It is the engine's Locker (engine.Locker), which its recovery runs under.
type Locker interface {
	TryLock(ctx context.Context, key string) (idem.Lock, error)
}

// LockKey is the lock name of a scope under the locker's prefix:
// <tenant>/<operation>/<key>, each part path-escaped. It is the engine's
// (engine.LockKey): Create's takeovers and the recovery worker's run
// through the engine and fence each other.
func LockKey(scope idem.Scope) string { return engine.LockKey(scope) }

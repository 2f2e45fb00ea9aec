//go:build !failpoints

package store

import "github.com/idemcoord/idem"

// unfencedWhere: a release build has no unfenced writes (see UnfencedToken
// in builds with -tags failpoints); every write is fenced.
func unfencedWhere(idem.Lease) (string, bool) { return "", false }

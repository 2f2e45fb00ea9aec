package store

// HoldGroup makes s's completions queue as if a batch were in flight,
// until the returned release runs the queued ones as one batch. queued
// reports how many wait.
func HoldGroup(s *Store) (queued func() int, release func()) {
	return s.completions.queued, s.completions.hold()
}

// HoldClaims is HoldGroup for s's claims.
func HoldClaims(s *Store) (queued func() int, release func()) {
	return s.claims.queued, s.claims.hold()
}

// HoldCheckpoints is HoldGroup for s's checkpoints.
func HoldCheckpoints(s *Store) (queued func() int, release func()) {
	return s.checkpoints.queued, s.checkpoints.hold()
}

// HoldClaimOrRead is HoldGroup for g's claims.
func HoldClaimOrRead(g *ClaimOrReadGroup) (queued func() int, release func()) {
	return g.g.queued, g.g.hold()
}

package store

// HoldGroup makes s's completions queue as if a batch were in flight,
// until the returned release runs the queued ones as one batch. queued
// reports how many wait.
func HoldGroup(s *Store) (queued func() int, release func()) {
	g := s.group
	g.mu.Lock()
	g.busy = true
	g.mu.Unlock()
	queued = func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue)
	}
	release = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.queue) > 0 {
			close(g.queue[0].lead)
		} else {
			g.busy = false
		}
	}
	return queued, release
}

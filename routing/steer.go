package routing

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Steering the client away from silent members. A watch found silent is
// most often on a member that a partition cut off from this node. gRPC
// keeps that member's connection (it looks ready until a keepalive ping
// goes unanswered, 15s at the soonest) and balances new streams and
// requests onto it in turn, so the watch opened again can land on the same
// member and stay silent for another WatchStaleAfter: a node that learned of
// a region's failover 7s after the region was cut, against 3 to 4s for its
// peers, did so. Before a Map opens its watch again it asks every endpoint
// of the client for its status, each on a connection of its own, within
// WatchProbeInterval; when some answer and some do not, it sets the
// client's endpoints to those that answered, so that the watch, and every
// other user of the client (the region lease's keepalive, reads), leaves
// the silent members at once. Every RejoinInterval it asks the members it
// left again and gives the client back each one that answers; Close gives
// back every one it still holds out.

// RejoinInterval is how often a Map asks the members it steered its
// client away from whether they answer again.
const RejoinInterval = 5 * time.Second

// steering holds the endpoints a Map took out of its client.
type steering struct {
	mu sync.Mutex
	// left are the endpoints taken out, until they answer again.
	left []string
	// asked is when the left endpoints were last asked.
	asked time.Time
}

// statusOf asks each endpoint for its status within WatchProbeInterval,
// concurrently, and returns those that answered and those that did not,
// each in eps's order.
func (m *Map) statusOf(ctx context.Context, eps []string) (answered, silent []string) {
	ok := make([]bool, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, WatchProbeInterval)
			defer cancel()
			_, err := m.cli.Status(sctx, ep)
			ok[i] = err == nil
		})
	}
	wg.Wait()
	for i, ep := range eps {
		if ok[i] {
			answered = append(answered, ep)
		} else {
			silent = append(silent, ep)
		}
	}
	return answered, silent
}

// steerAway sets the client's endpoints to those that answer, when some
// answer and some do not. It returns when every endpoint has answered or
// WatchProbeInterval has passed.
func (m *Map) steerAway(ctx context.Context) {
	eps := m.cli.Endpoints()
	if len(eps) < 2 {
		return
	}
	answered, silent := m.statusOf(ctx, eps)
	if len(answered) == 0 || len(silent) == 0 {
		// Nothing answers (this node is the one cut off, and no choice
		// helps), or everything does (the watch was slow, not cut off).
		return
	}
	m.steer.mu.Lock()
	defer m.steer.mu.Unlock()
	for _, ep := range silent {
		if !slices.Contains(m.steer.left, ep) {
			m.steer.left = append(m.steer.left, ep)
		}
	}
	m.steer.asked = time.Now()
	m.cli.SetEndpoints(answered...)
	m.logger.Warn("etcd endpoints silent; the client leaves them until they answer", "silent", silent, "using", answered)
}

// rejoin asks the endpoints taken out, at most every RejoinInterval, and
// gives the client back those that answer.
func (m *Map) rejoin(ctx context.Context) {
	m.steer.mu.Lock()
	left := slices.Clone(m.steer.left)
	due := len(left) > 0 && time.Since(m.steer.asked) >= RejoinInterval
	if due {
		m.steer.asked = time.Now()
	}
	m.steer.mu.Unlock()
	if !due {
		return
	}
	answered, _ := m.statusOf(ctx, left)
	if len(answered) == 0 {
		return
	}
	m.giveBack(answered)
	m.logger.Info("etcd endpoints answer again; the client uses them again", "endpoints", answered)
}

// giveBack adds eps to the client's endpoints and forgets them as taken
// out.
func (m *Map) giveBack(eps []string) {
	m.steer.mu.Lock()
	defer m.steer.mu.Unlock()
	cur := m.cli.Endpoints()
	add := false
	for _, ep := range eps {
		m.steer.left = slices.DeleteFunc(m.steer.left, func(l string) bool { return l == ep })
		if !slices.Contains(cur, ep) {
			cur = append(cur, ep)
			add = true
		}
	}
	if add {
		m.cli.SetEndpoints(cur...)
	}
}

// giveBackAll gives the client back every endpoint still taken out.
func (m *Map) giveBackAll() {
	m.steer.mu.Lock()
	left := slices.Clone(m.steer.left)
	m.steer.mu.Unlock()
	if len(left) > 0 {
		m.giveBack(left)
	}
}

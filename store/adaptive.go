package store

import "time"

// adaptive chooses a group's regime by measuring it: batching (at most
// the group's inFlight batches in flight, later writes queue and go
// together) or alone (every write its own statement at once).
//
// Which one serves more depends on the machine, not on the code. Where a
// commit's flush is dear, a batch shares one flush among its writes and
// batching wins (the store suite at concurrency 8: 0.87 and 0.91 of the
// baseline against 0.67 and 0.77 alone); where it is cheap (a fast disk,
// or fsync off), PostgreSQL's own merging of concurrent commits' flushes
// does what the group does, and eight writers held to two batches in
// flight lose to eight statements (0.54 and 0.52 against 0.62 and 0.66).
// In both, the regime that served more was the one whose writes waited
// less, from queueing to outcome (docs/benchmarks.md, "A group commit
// that measures whether batching pays").
//
// So the group runs in windows of adaptWindow writes (256), keeps a smoothed
// mean of each regime's latency, runs the better one, and every
// adaptExplore windows (8) runs the other for one window, so that a change of
// load or machine is seen. Only writes that queued and finished in one
// regime are measured (epoch): the first writes after a switch still wait
// on the other regime's batches.
type adaptive struct {
	// alone is the regime in force.
	alone bool
	// epoch counts the switches.
	epoch uint64
	// n and sum are the writes measured in this window and their latency.
	n   int
	sum time.Duration
	// mean is each regime's smoothed mean latency (batching, alone); zero
	// until measured.
	mean [2]time.Duration
	// windows counts the windows since the last exploration.
	windows int
	// window is how many writes a window measures; explore how many
	// windows pass between two windows of the regime not in force.
	window, explore int
}

// newAdaptive is an adaptive group's chooser, batching first.
func newAdaptive() *adaptive {
	return &adaptive{window: adaptWindow, explore: adaptExplore}
}

const (
	// adaptWindow is how many writes a window measures.
	adaptWindow = 256
	// adaptExplore is how many windows pass between two windows of the
	// regime not in force.
	adaptExplore = 8
)

// observe counts a write of epoch that waited d, and reports whether the
// regime changed. The group's lock is held.
func (a *adaptive) observe(epoch uint64, d time.Duration) bool {
	if epoch != a.epoch {
		return false
	}
	a.n++
	a.sum += d
	if a.n < a.window {
		return false
	}
	cur, other := regime(a.alone), regime(!a.alone)
	m := a.sum / time.Duration(a.n)
	if a.mean[cur] == 0 {
		a.mean[cur] = m
	} else {
		a.mean[cur] = (a.mean[cur] + m) / 2
	}
	a.n, a.sum = 0, 0
	a.windows++
	next := a.alone
	switch {
	case a.mean[other] == 0 || a.windows >= a.explore:
		// Measure the other regime: never yet, or not lately.
		next, a.windows = !a.alone, 0
	case a.mean[other] < a.mean[cur]:
		next = !a.alone
	}
	if next == a.alone {
		return false
	}
	a.alone = next
	a.epoch++
	return true
}

// regime is the index of a regime in adaptive.mean.
func regime(alone bool) int {
	if alone {
		return 1
	}
	return 0
}

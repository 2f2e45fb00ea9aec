package store

import "sync/atomic"

// The kinds of the store's group commits, as GroupStats names them.
const (
	// GroupClaims are Begin's claims (the engine's: the middleware, the
	// sidecar, the coordination API).
	GroupClaims = "claim"
	// GroupOperationClaims are an operation's claims with its own writes
	// (NewClaimOrReadGroup: a payment's claim with the payment).
	GroupOperationClaims = "operation_claim"
	// GroupCheckpoints are owners' checkpoints.
	GroupCheckpoints = "checkpoint"
	// GroupCompletions are owners' completions.
	GroupCompletions = "completion"
)

// groupKinds are the kinds in GroupStats' order.
var groupKinds = [...]string{GroupClaims, GroupOperationClaims, GroupCheckpoints, GroupCompletions}

// GroupStats counts what one kind of the store's group commits sent since
// the store opened: how many writes went in a statement of their own
// (nothing else waited, or the group was sending every write alone: see
// NewClaimOrReadGroup), how many went in batches of two or more, and how
// many such batches (Batched/Batches is their mean size). A batch whose
// statement failed and whose writes were then sent one by one counts as
// the batch it was sent as.
type GroupStats struct {
	Kind                  string
	Own, Batched, Batches uint64
}

// groupCounters are one kind's GroupStats.
type groupCounters struct {
	own, batched, batches atomic.Uint64
}

// count counts a batch of n writes; c may be nil (a group of a test).
func (c *groupCounters) count(n int) {
	switch {
	case c == nil || n == 0:
	case n == 1:
		c.own.Add(1)
	default:
		c.batched.Add(uint64(n))
		c.batches.Add(1)
	}
}

// groupCounters are the counters of kind (one of groupKinds).
func (s *Store) groupCounters(kind string) *groupCounters {
	for i, k := range groupKinds {
		if k == kind {
			return &s.groups[i]
		}
	}
	panic("store: unknown group kind " + kind)
}

// GroupStats reports what each kind of the store's group commits sent
// since it opened, every kind in a fixed order (zeros for a store opened
// with Options.NoGroupCommit).
func (s *Store) GroupStats() []GroupStats {
	out := make([]GroupStats, len(groupKinds))
	for i, k := range groupKinds {
		c := &s.groups[i]
		out[i] = GroupStats{Kind: k, Own: c.own.Load(), Batched: c.batched.Load(), Batches: c.batches.Load()}
	}
	return out
}

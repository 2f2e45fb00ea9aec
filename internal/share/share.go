// Package share estimates which share of recent events were of one kind
// (a node's recent claims that found their key taken, say), cheaply
// enough to be updated by every request: an exponentially weighted moving
// average over about the last Span events, in fixed point, updated
// without a lock.
package share

import "sync/atomic"

const (
	// one is a share of 1 in fixed point.
	one = 1 << 16
	// Span is how many recent events the estimate weighs: the weight of
	// one event is 1/Span.
	Span = 64
)

// Share is the estimate. The zero value starts from a share of 0.
type Share struct {
	v atomic.Int64
}

// Observe counts one event: hit says it was of the kind measured.
func (s *Share) Observe(hit bool) {
	x := int64(0)
	if hit {
		x = one
	}
	for {
		old := s.v.Load()
		if s.v.CompareAndSwap(old, old+(x-old)/Span) {
			return
		}
	}
}

// Above reports whether the estimate exceeds x (between 0 and 1).
func (s *Share) Above(x float64) bool { return s.v.Load() > int64(x*one) }

// Value is the estimate, between 0 and 1.
func (s *Share) Value() float64 { return float64(s.v.Load()) / one }

package share_test

import (
	"sync"
	"testing"

	"github.com/idemcoord/idem/internal/share"
)

func TestShareFollowsRecentEvents(t *testing.T) {
	var s share.Share
	if s.Value() != 0 || s.Above(0) {
		t.Fatalf("zero value = %v, want 0", s.Value())
	}
	for range 4 * share.Span {
		s.Observe(true)
	}
	if !s.Above(0.9) {
		t.Fatalf("after %d hits: %v, want above 0.9", 4*share.Span, s.Value())
	}
	// One hit in ten, for long enough to forget the run of hits.
	for i := range 20 * share.Span {
		s.Observe(i%10 == 0)
	}
	if v := s.Value(); v < 0.05 || v > 0.2 {
		t.Fatalf("one hit in ten: %v, want about 0.1", v)
	}
	if s.Above(0.3) || !s.Above(0.01) {
		t.Fatalf("one hit in ten: %v compared wrongly", s.Value())
	}
}

func TestShareUnderConcurrentObservers(t *testing.T) {
	var s share.Share
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 * share.Span {
				s.Observe(true)
			}
		})
	}
	wg.Wait()
	// Every update lands (compare and swap): 80 spans of hits leave the
	// estimate within a hair of 1.
	if !s.Above(0.99) || s.Value() > 1 {
		t.Fatalf("after concurrent hits: %v, want just below 1", s.Value())
	}
}

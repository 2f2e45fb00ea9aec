package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

// feed feeds a whole window of writes that each waited d, and reports
// whether the regime changed.
func (a *adaptive) feed(d time.Duration) bool {
	changed := false
	for range a.window {
		changed = a.observe(a.epoch, d) || changed
	}
	return changed
}

// TestAdaptiveRunsTheFasterRegime: the chooser measures batching first,
// then sending alone, keeps the regime whose writes waited less, and
// every explore windows measures the other for one window, so that it
// turns when the other becomes the faster.
func TestAdaptiveRunsTheFasterRegime(t *testing.T) {
	a := &adaptive{window: 4, explore: 3}
	const fast, slow = time.Millisecond, 2 * time.Millisecond
	latency := func() time.Duration { // alone is the faster
		if a.alone {
			return fast
		}
		return slow
	}
	var regimes []bool
	for range 12 {
		a.feed(latency())
		regimes = append(regimes, a.alone)
	}
	// Batching measured (slow), alone never measured: alone. Then, of every
	// explore windows, one of batching (slower: back to alone).
	want := []bool{true, true, true, false, true, true, false, true, true, false, true, true}
	if fmt.Sprint(regimes) != fmt.Sprint(want) {
		t.Errorf("regimes after each window = %v, want %v", regimes, want)
	}

	// The machine changes: batching becomes the faster. The next window of
	// batching (an exploration) shows it, and the chooser stays there.
	latency = func() time.Duration {
		if a.alone {
			return 4 * slow
		}
		return fast
	}
	for range 2 * a.explore {
		a.feed(latency())
	}
	batching := 0
	for range a.explore {
		a.feed(latency())
		if !a.alone {
			batching++
		}
	}
	// Of explore windows, at most one explores alone.
	if batching < a.explore-1 {
		t.Errorf("batching in %d of %d windows once it is the faster, want %d", batching, a.explore, a.explore-1)
	}
}

// TestAdaptiveIgnoresWritesOfAnotherRegime: a write that queued before a
// switch is not counted in the new regime's window.
func TestAdaptiveIgnoresWritesOfAnotherRegime(t *testing.T) {
	a := &adaptive{window: 2, explore: 8}
	old := a.epoch
	if !a.feed(time.Millisecond) {
		t.Fatal("no switch after a window of batching with alone unmeasured")
	}
	for range 10 {
		if a.observe(old, time.Hour) {
			t.Fatal("a write of the old regime switched the regime")
		}
	}
	if a.n != 0 || a.mean[regime(true)] != 0 {
		t.Fatalf("writes of the old regime were measured: n %d, mean %v", a.n, a.mean)
	}
}

// TestAdaptiveGroupUnderSwitches: many writers, few scopes, and a regime
// that switches every few writes. Every write is written exactly once, in
// a batch that holds no two writes of its scope, each caller gets its own
// write's outcome, and none waits for good: the test ends. Run with -race.
func TestAdaptiveGroupUnderSwitches(t *testing.T) {
	var (
		mu      sync.Mutex
		written = map[int]int{}
		bad     atomic.Value
		batches atomic.Int64
	)
	g := &group[int, int]{
		inFlight: 2,
		adapt:    &adaptive{window: 3, explore: 2},
		scope:    func(in int) idem.Scope { return idem.Scope{Tenant: "t", Operation: "o", Key: fmt.Sprint(in % 5)} },
	}
	g.write = func(_ context.Context, batch []*groupItem[int, int]) {
		batches.Add(1)
		seen := map[idem.Scope]bool{}
		for _, it := range batch {
			sc := g.scope(it.in)
			if seen[sc] {
				bad.Store(fmt.Sprintf("a batch holds two writes of %v", sc))
			}
			seen[sc] = true
			mu.Lock()
			written[it.in]++
			mu.Unlock()
			it.out = it.in * 10
		}
		// Vary the regimes' latencies, so that the chooser turns both ways.
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	}

	const writers, each = 16, 200
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				in := w*each + i
				out, err := g.do(context.Background(), in)
				if err != nil || out != in*10 {
					bad.Store(fmt.Sprintf("write %d: outcome %d, %v", in, out, err))
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		g.mu.Lock()
		t.Fatalf("writers still waiting: %d queued, %d leads out, alone %v", len(g.queue), g.running, g.adapt.alone)
	}
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if len(written) != writers*each {
		t.Fatalf("%d writes written, want %d", len(written), writers*each)
	}
	for in, n := range written {
		if n != 1 {
			t.Fatalf("write %d written %d times", in, n)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.adapt.epoch < 10 {
		t.Errorf("the regime switched %d times, want many: the test did not exercise switching", g.adapt.epoch)
	}
	if g.running != 0 || len(g.queue) != 0 {
		t.Errorf("after the writes: %d leads out, %d queued; want none", g.running, len(g.queue))
	}
	if b := batches.Load(); b >= writers*each {
		t.Errorf("%d batches for %d writes: no write ever joined a batch", b, writers*each)
	}
}

// TestGroupLeadsFollowTheRegime: once the group turns from sending writes
// alone to batching, a finished lead is given up, not handed on, while
// more leads are out than batching allows; once it turns to sending alone,
// every queued write gets a lead at once.
func TestGroupLeadsFollowTheRegime(t *testing.T) {
	g := &group[int, int]{inFlight: 2, adapt: &adaptive{window: 1, explore: 8}}
	item := func() *groupItem[int, int] {
		return &groupItem[int, int]{done: make(chan struct{}), lead: make(chan struct{})}
	}
	g.queue = []*groupItem[int, int]{item(), item(), item()}
	g.running = 5 // leads out while every write went alone; now batching
	g.handOn()
	if g.running != 4 || g.queue[0].led {
		t.Fatalf("a finished lead with 5 out and 2 allowed: %d out, first queued led %v; want 4 and false", g.running, g.queue[0].led)
	}
	g.running = 2
	g.handOn()
	if g.running != 2 || !g.queue[0].led {
		t.Fatalf("a finished lead with 2 out and 2 allowed: %d out, first queued led %v; want 2 and true", g.running, g.queue[0].led)
	}

	g.adapt.alone = true
	g.running = 1
	g.fill()
	for i, it := range g.queue {
		if !it.led {
			t.Errorf("queued write %d has no lead once writes go alone", i)
		}
	}
	if g.running != 3 {
		t.Errorf("%d leads out after fill, want 3 (one out, two handed)", g.running)
	}
}

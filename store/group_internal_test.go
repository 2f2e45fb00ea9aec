package store

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

// TestASecondBatchStartsOnceEnoughWritesWait: a write that finds no batch
// in flight goes at once; beside one in flight, another batch starts only
// when extraAt writes wait, and it carries them all. Every write gets its
// own outcome.
func TestASecondBatchStartsOnceEnoughWritesWait(t *testing.T) {
	started := make(chan []int, 8)
	release := make(chan struct{})
	g := &group[int, int]{inFlight: 2, extraAt: 3,
		scope: func(in int) idem.Scope { return idem.Scope{Tenant: "t", Operation: "op", Key: strconv.Itoa(in)} },
		write: func(_ context.Context, batch []*groupItem[int, int]) {
			var ins []int
			for _, it := range batch {
				ins = append(ins, it.in)
			}
			started <- ins
			<-release
			for _, it := range batch {
				it.out = it.in * 10
			}
		}}
	running := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.running
	}
	var wg sync.WaitGroup
	outs := make([]int, 5)
	do := func(in int) {
		wg.Go(func() {
			out, err := g.do(context.Background(), in)
			if err != nil {
				t.Errorf("write %d: %v", in, err)
			}
			outs[in] = out
		})
	}

	do(1)
	if got := <-started; !slices.Equal(got, []int{1}) {
		t.Fatalf("first batch = %v, want the write that found none in flight, [1]", got)
	}
	// Two writes wait beside the batch in flight: fewer than extraAt, so
	// they start no batch of their own.
	for in := 2; in <= 3; in++ {
		do(in)
		waitQueued(t, g, in-1)
		if n := running(); n != 1 {
			t.Fatalf("with %d writes waiting, %d batches are running, want 1", in-1, n)
		}
		select {
		case b := <-started:
			t.Fatalf("a batch %v started with %d writes waiting, fewer than extraAt (3)", b, in-1)
		default:
		}
	}
	// The third waiting write starts a second batch, which takes all three.
	do(4)
	if got := <-started; !slices.Equal(got, []int{2, 3, 4}) {
		t.Fatalf("second batch = %v, want the three waiting writes [2 3 4]", got)
	}
	close(release)
	wg.Wait()
	for in := 1; in <= 4; in++ {
		if outs[in] != in*10 {
			t.Errorf("write %d got %d, want %d", in, outs[in], in*10)
		}
	}
	if n, q := running(), g.queued(); n != 0 || q != 0 {
		t.Errorf("after every write: %d batches running, %d writes queued; want none", n, q)
	}
}

// waitQueued waits until n writes are queued in g.
func waitQueued[In, Out any](t *testing.T, g *group[In, Out], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", g.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWritesAloneIgnoreExtraAt: while an adaptive group sends every write
// alone, a write never waits for others to queue: each starts its own
// statement at once, whatever extraAt says.
func TestWritesAloneIgnoreExtraAt(t *testing.T) {
	started := make(chan int, 8)
	release := make(chan struct{})
	a := newAdaptive()
	a.alone = true
	g := &group[int, int]{inFlight: 2, extraAt: 4, adapt: a,
		scope: func(in int) idem.Scope { return idem.Scope{Tenant: "t", Operation: "op", Key: strconv.Itoa(in)} },
		write: func(_ context.Context, batch []*groupItem[int, int]) {
			for _, it := range batch {
				started <- it.in
			}
			<-release
			for _, it := range batch {
				it.out = it.in * 10
			}
		}}
	var wg sync.WaitGroup
	for in := range 4 {
		wg.Go(func() {
			if out, err := g.do(context.Background(), in); err != nil || out != in*10 {
				t.Errorf("write %d = %d, %v; want %d", in, out, err, in*10)
			}
		})
	}
	seen := map[int]bool{}
	for range 4 {
		select {
		case in := <-started:
			seen[in] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 4 writes started while every write goes alone, want all of them at once", len(seen))
		}
	}
	close(release)
	wg.Wait()
}

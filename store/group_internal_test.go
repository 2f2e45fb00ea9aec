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
	g, started, release := gatedGroup(func(in int) string { return strconv.Itoa(in) })
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

// gatedGroup is a group of two batches in flight, the second once three
// writes wait, whose writes of n have key(n) and get n*10. Each batch sends
// its writes on started, then waits until release is closed.
func gatedGroup(key func(int) string) (g *group[int, int], started chan []int, release chan struct{}) {
	started, release = make(chan []int, 16), make(chan struct{})
	g = &group[int, int]{inFlight: 2, extraAt: 3,
		scope: func(in int) idem.Scope { return idem.Scope{Tenant: "t", Operation: "op", Key: key(in)} },
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
	return g, started, release
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

// TestWritesOfOneScopeAllFinish: a batch holds one write of a scope, so a
// caller handed a lead may run a batch that leaves its own write queued
// (an earlier write of its scope went instead). Its write must still be
// taken by a later batch once the caller's lead is spent, and every write
// finish: many retries of one key arriving together (two nodes' clients,
// one key) once left the last of them queued with no batch to come.
func TestWritesOfOneScopeAllFinish(t *testing.T) {
	g, started, release := gatedGroup(func(int) string { return "one" })
	var wg sync.WaitGroup
	const writes = 6
	outs := make([]int, writes+1)
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
		t.Fatalf("first batch = %v, want [1]", got)
	}
	// Writes 2 and 3 wait; write 4 starts a second batch, which can take
	// only write 2 (one write of a scope per batch): write 4 stays queued
	// with its lead spent.
	for in := 2; in <= 4; in++ {
		do(in)
		if in < 4 {
			waitQueued(t, g, in-1)
		}
	}
	if got := <-started; !slices.Equal(got, []int{2}) {
		t.Fatalf("second batch = %v, want [2], the oldest waiting write of the scope", got)
	}
	for in := 5; in <= writes; in++ {
		do(in)
	}
	waitQueued(t, g, writes-2)
	close(release)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatalf("writes still waiting with no batch to take them: %d queued", g.queued())
	}
	for in := 1; in <= writes; in++ {
		if outs[in] != in*10 {
			t.Errorf("write %d got %d, want %d", in, outs[in], in*10)
		}
	}
	for b := range len(started) {
		if got := <-started; len(got) != 1 {
			t.Errorf("batch %d after the release = %v, want one write of the scope", b, got)
		}
	}
}

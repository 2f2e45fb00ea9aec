package answers_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine/answers"
	"github.com/idemcoord/idem/internal/fakeclock"
)

func scope(key string) idem.Scope {
	return idem.Scope{Tenant: "tenant-a", Operation: "create_transfer", Key: key}
}

func entry(body int, until time.Time) answers.Entry {
	return answers.Entry{RequestHash: "v2:" + strings.Repeat("a", 64), Status: idem.StatusCompleted, Until: until,
		Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json", "Location": "/t/1"},
			Body: make([]byte, body), SchemaVersion: "v2"}}
}

// TestLeastRecentlyUsedLeaveFirst: at its bound the cache drops the entry
// used least recently, a Get counting as a use.
func TestLeastRecentlyUsedLeaveFirst(t *testing.T) {
	clk := fakeclock.NewManual(time.Unix(0, 0))
	until := clk.Now().Add(time.Hour)
	one := answers.New(answers.Options{MaxBytes: 1 << 20, Now: clk.Now})
	one.Put(answers.KindAnswer, scope("probe"), entry(100, until))
	c := answers.New(answers.Options{MaxBytes: 3 * one.Bytes(), Now: clk.Now})
	for _, k := range []string{"a", "b", "c"} {
		if !c.Put(answers.KindAnswer, scope(k), entry(100, until)) {
			t.Fatalf("Put %s refused", k)
		}
	}
	if _, ok := c.Get(answers.KindAnswer, scope("a")); !ok {
		t.Fatal("a missing before the bound was reached")
	}
	c.Put(answers.KindAnswer, scope("d"), entry(100, until))
	for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		if _, ok := c.Get(answers.KindAnswer, scope(k)); ok != want {
			t.Errorf("%s kept = %v, want %v (b is the least recently used)", k, ok, want)
		}
	}
	if c.Bytes() > c.MaxBytes() {
		t.Errorf("holds %d bytes, bound %d", c.Bytes(), c.MaxBytes())
	}
}

// TestEntriesEndAtTheirTime: an entry answers until its Until, not at it.
func TestEntriesEndAtTheirTime(t *testing.T) {
	clk := fakeclock.NewManual(time.Unix(0, 0))
	c := answers.New(answers.Options{MaxBytes: 1 << 20, Now: clk.Now})
	if c.Put(answers.KindAnswer, scope("past"), entry(1, clk.Now())) {
		t.Error("an entry already at its end was kept")
	}
	c.Put(answers.KindAnswer, scope("k"), entry(1, clk.Now().Add(time.Minute)))
	clk.Advance(time.Minute - time.Nanosecond)
	if _, ok := c.Get(answers.KindAnswer, scope("k")); !ok {
		t.Error("entry gone before its time")
	}
	clk.Advance(time.Nanosecond)
	if _, ok := c.Get(answers.KindAnswer, scope("k")); ok {
		t.Error("entry answered at its time")
	}
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Errorf("an ended entry found by a lookup is still held: %d entries, %d bytes", c.Len(), c.Bytes())
	}
}

// TestKindsAndGenerations: kinds never see each other's entries; a live
// entry is not replaced by one of an earlier generation, a later one
// replaces it.
func TestKindsAndGenerations(t *testing.T) {
	clk := fakeclock.NewManual(time.Unix(0, 0))
	c := answers.New(answers.Options{MaxBytes: 1 << 20, Now: clk.Now})
	until := clk.Now().Add(time.Hour)
	e := entry(1, until)
	e.Generation = 2
	c.Put(answers.KindAnswer, scope("k"), e)
	if _, ok := c.Get(answers.KindRecord, scope("k")); ok {
		t.Error("a record found under an answer's scope")
	}
	older := entry(2, until)
	older.Generation = 1
	if c.Put(answers.KindAnswer, scope("k"), older) {
		t.Error("an earlier generation replaced a live entry")
	}
	newer := entry(3, until)
	newer.Generation = 3
	if !c.Put(answers.KindAnswer, scope("k"), newer) {
		t.Error("a later generation was refused")
	}
	if got, _ := c.Get(answers.KindAnswer, scope("k")); got.Generation != 3 || len(got.Response.Body) != 3 || c.Len() != 1 {
		t.Errorf("entry = generation %d, body %d, %d entries; want generation 3 alone", got.Generation, len(got.Response.Body), c.Len())
	}
	var nilCache *answers.Cache
	if nilCache.Put(answers.KindAnswer, scope("k"), e) || nilCache.Len() != 0 {
		t.Error("a nil cache kept something")
	}
	if _, ok := nilCache.Get(answers.KindAnswer, scope("k")); ok {
		t.Error("a nil cache found something")
	}
	if answers.New(answers.Options{}) != nil {
		t.Error("New without a size made a cache")
	}
}

// TestBoundHoldsOnTheHeap: what the cache counts against its bound is at
// least what its entries hold on the heap, so the memory it keeps stays
// under MaxBytes. Entries of every shape are put (bodies, headers,
// records, long and short keys) until the cache is full, and the heap is
// measured with and without it.
func TestBoundHoldsOnTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	const bound = 8 << 20
	for _, shape := range []struct {
		name string
		make func(i int, rng *rand.Rand) (answers.Kind, idem.Scope, answers.Entry)
	}{
		{"small answers", func(i int, rng *rand.Rand) (answers.Kind, idem.Scope, answers.Entry) {
			return answers.KindAnswer, scope(fmt.Sprint(i)), entry(0, time.Now().Add(time.Hour))
		}},
		{"bodies", func(i int, rng *rand.Rand) (answers.Kind, idem.Scope, answers.Entry) {
			return answers.KindAnswer, scope(strings.Repeat("k", rng.IntN(255)) + fmt.Sprint(i)), entry(rng.IntN(4000), time.Now().Add(time.Hour))
		}},
		{"many headers", func(i int, rng *rand.Rand) (answers.Kind, idem.Scope, answers.Entry) {
			e := entry(10, time.Now().Add(time.Hour))
			e.Response.Headers = map[string]string{}
			for h := range 9 + rng.IntN(20) {
				e.Response.Headers[fmt.Sprint("X-Header-", h)] = strings.Repeat("v", rng.IntN(40))
			}
			return answers.KindAnswer, scope(fmt.Sprint(i)), e
		}},
		{"records", func(i int, rng *rand.Rand) (answers.Kind, idem.Scope, answers.Entry) {
			e := entry(0, time.Now().Add(time.Hour))
			resp := e.Response
			resp.Body = make([]byte, rng.IntN(300))
			locked := time.Now()
			e.Response = idem.Response{}
			e.Record = &idem.Record{Scope: scope(fmt.Sprint(i)), RequestHash: e.RequestHash, HashVersion: 2, Status: idem.StatusCompleted,
				Checkpoint: idem.CheckpointCompleted, Owner: "coord/tenant-a", FencingToken: 1, LockedUntil: &locked, Attempts: 1,
				Response: &resp, ResourceType: "transfer", ResourceID: fmt.Sprint("tr_", i), HomeRegion: "eu-west",
				CreatedAt: time.Now(), UpdatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
			return answers.KindRecord, scope(fmt.Sprint(i)), e
		}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			before := heap()
			c := answers.New(answers.Options{MaxBytes: bound})
			for i := 0; c.Bytes() < bound-(64<<10) && i < 1e6; i++ {
				c.Put(shape.make(i, rng))
			}
			with := heap()
			held := int64(with) - int64(before)
			runtime.KeepAlive(c)
			if held > c.Bytes() || c.Bytes() > bound {
				t.Errorf("%d entries hold %d bytes of heap, counted %d against a bound of %d", c.Len(), held, c.Bytes(), bound)
			}
			t.Logf("%d entries: %d bytes of heap, counted %d (%.2f)", c.Len(), held, c.Bytes(), float64(held)/float64(c.Bytes()))
		})
	}
}

func heap() uint64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestBoundHoldsAfterEntriesGrow: a cache full of the smallest entries
// (its map grown to hold them all) that then holds a few large ones keeps
// no more heap than it counts.
func TestBoundHoldsAfterEntriesGrow(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	const bound = 8 << 20
	before := heap()
	c := answers.New(answers.Options{MaxBytes: bound})
	for i := 0; c.Bytes() < bound-(4<<10); i++ {
		c.Put(answers.KindAnswer, scope(fmt.Sprint("small-", i)), answers.Entry{Until: time.Now().Add(time.Hour)})
	}
	small := c.Len()
	for i := 0; i < 2*bound/(16<<10); i++ {
		c.Put(answers.KindAnswer, scope(fmt.Sprint("large-", i)), entry(16<<10, time.Now().Add(time.Hour)))
	}
	held := int64(heap()) - int64(before)
	runtime.KeepAlive(c)
	if held > c.Bytes() || c.Bytes() > bound {
		t.Errorf("%d large entries (after %d small) hold %d bytes of heap, counted %d against a bound of %d", c.Len(), small, held, c.Bytes(), bound)
	}
	t.Logf("%d large entries after %d small: %d bytes of heap, counted %d", c.Len(), small, held, c.Bytes())
}

// TestChurnStaysWithinTheBound: concurrent puts and gets of ever new keys
// never make the cache hold more than its bound (run with -race).
func TestChurnStaysWithinTheBound(t *testing.T) {
	const bound = 64 << 10
	c := answers.New(answers.Options{MaxBytes: bound})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := range 3000 {
				k := scope(fmt.Sprintf("%d-%d", w, i))
				c.Put(answers.KindAnswer, k, entry(rng.IntN(2000), time.Now().Add(time.Hour)))
				c.Get(answers.KindAnswer, scope(fmt.Sprintf("%d-%d", w, rng.IntN(i+1))))
				if b := c.Bytes(); b > bound {
					t.Errorf("holds %d bytes, bound %d", b, bound)
					return
				}
			}
		}()
	}
	wg.Wait()
	if c.Bytes() > bound || c.Len() == 0 {
		t.Errorf("after the churn: %d entries, %d bytes (bound %d)", c.Len(), c.Bytes(), bound)
	}
}

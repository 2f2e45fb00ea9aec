// Package answers keeps the answers of settled idempotency records in
// memory, bounded by bytes, so that a node replays a retry with no store
// round trip (the design's "Settled answers may be served from memory").
//
// A record that is COMPLETED or FAILED_REPLAYABLE never changes until its
// window ends, so its answer can be kept: a Cache holds, for a scope, the
// record's request hash, generation, state and answer, and an instant on
// the caller's clock after which the entry no longer answers. The least
// recently used entries leave first when the bytes it holds would pass its
// bound.
//
// The Cache keeps what it is given and nothing decides for it: what may be
// kept, and until when, is the caller's rule. Package engine keeps it
// (engine.AnswerCache): an entry comes only from a commit the node saw
// acknowledged or from a durable read, and lives no longer than its
// record's window and the body retention, measured on the node's own
// monotonic clock from the store's time.
package answers

import (
	"bytes"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem"
)

// Kind separates what different callers keep for one scope.
type Kind uint8

const (
	// KindAnswer is the answer a replay returns (engine.Engine.Do), as the
	// operation renders it.
	KindAnswer Kind = iota
	// KindRecord is the record as the store returned it, for a caller that
	// answers with the record itself (the Coordinator's Begin, which the
	// coordination API serves).
	KindRecord
)

// Reasons an entry leaves the cache (Metrics.Evicted).
const (
	// EvictedSize: dropped, least recently used first, to keep the cache
	// within its bytes.
	EvictedSize = "size"
	// EvictedExpired: found past its time by a lookup.
	EvictedExpired = "expired"
)

// Metrics counts what a Cache does. Package idemprom implements it with
// Prometheus counters and gauges registered on a prometheus.Registerer;
// this package imports no metrics library.
type Metrics interface {
	// Lookup counts a lookup that found a live entry (hit) or did not.
	Lookup(hit bool)
	// Evicted counts an entry that left the cache (EvictedSize,
	// EvictedExpired).
	Evicted(reason string)
	// Held reports the entries and bytes the cache holds after a change.
	Held(entries int, bytes int64)
}

// Entry is what the cache keeps of one settled record.
type Entry struct {
	// RequestHash is the record's request hash: a request whose hashes
	// hold it is replayed, any other is refused (idem.Decide).
	RequestHash string
	// RawHash is the raw hash of a request known to be the record's
	// command (fingerprint.RawHash), or "": a request with the same raw
	// hash is replayed without being parsed.
	RawHash string
	// Generation is the record's generation (idem.Record.Generation): an
	// entry never replaces a live one of a later generation.
	Generation int
	// Status is COMPLETED or FAILED_REPLAYABLE.
	Status idem.Status
	// Response is the answer as a replay returns it (KindAnswer).
	Response idem.Response
	// Record is the record as the store returned it (KindRecord), nil
	// otherwise.
	Record *idem.Record
	// Until is when the entry stops answering, on the cache's clock
	// (Options.Now).
	Until time.Time
}

// Options configure a Cache.
type Options struct {
	// MaxBytes bounds the bytes the entries hold (their strings, bodies,
	// headers and records, and a fixed cost per entry for the structures
	// around them). New returns nil (no cache) when it is not positive.
	MaxBytes int64
	// Now is the clock Entry.Until is read on. Default time.Now (whose
	// readings carry the monotonic clock).
	Now func() time.Time
	// Metrics counts hits, misses and evictions. Default: not counted.
	Metrics Metrics
}

// Cache is a bounded map from a kind and scope to an Entry. It is safe for
// concurrent use. A nil *Cache keeps nothing and finds nothing.
type Cache struct {
	max     int64
	now     func() time.Time
	metrics Metrics

	mu      sync.Mutex
	entries map[key]*node
	// peak is the most entries the map held since it was made: a map
	// keeps the room it grew to (see shrink).
	peak int
	// head is the most recently used entry, tail the least.
	head, tail *node
	bytes      int64
}

type key struct {
	kind Kind
	idem.Scope
}

type node struct {
	key        key
	entry      Entry
	size       int64
	prev, next *node
}

// New returns a cache of at most opts.MaxBytes, or nil when MaxBytes is
// not positive.
func New(opts Options) *Cache {
	if opts.MaxBytes <= 0 {
		return nil
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Cache{max: opts.MaxBytes, now: opts.Now, metrics: opts.Metrics, entries: map[key]*node{}}
}

// Get returns the live entry of scope in kind. An entry past its Until is
// dropped. The entry's Response and Record are shared with the cache:
// read them, never write to them.
func (c *Cache) Get(kind Kind, scope idem.Scope) (Entry, bool) {
	if c == nil {
		return Entry{}, false
	}
	now := c.now()
	c.mu.Lock()
	n, ok := c.entries[key{kind, scope}]
	expired := ok && !n.entry.Until.After(now)
	if expired {
		c.remove(n)
		c.shrink()
	} else if ok {
		c.toFront(n)
	}
	var e Entry
	if ok && !expired {
		e = n.entry
	}
	entries, held := len(c.entries), c.bytes
	c.mu.Unlock()
	if c.metrics != nil {
		if expired {
			c.metrics.Evicted(EvictedExpired)
			c.metrics.Held(entries, held)
		}
		c.metrics.Lookup(ok && !expired)
	}
	return e, ok && !expired
}

// Put keeps e for scope in kind, a deep copy of its strings, body, headers
// and record (so that it holds no memory of the caller's), and reports
// whether it did: an entry already past its Until, larger than the whole
// bound, or of an earlier generation than the live entry it would replace
// is not kept. Entries used least recently leave to make room.
func (c *Cache) Put(kind Kind, scope idem.Scope, e Entry) bool {
	if c == nil || !e.Until.After(c.now()) {
		return false
	}
	e = clone(e)
	k := key{kind, idem.Scope{Tenant: strings.Clone(scope.Tenant), Operation: strings.Clone(scope.Operation), Key: strings.Clone(scope.Key)}}
	size := sizeOf(k, e)
	if size > c.max {
		return false
	}
	now := c.now()
	var evicted int
	c.mu.Lock()
	if old, ok := c.entries[k]; ok {
		if old.entry.Until.After(now) && old.entry.Generation > e.Generation {
			c.mu.Unlock()
			return false
		}
		c.remove(old)
	}
	n := &node{key: k, entry: e, size: size}
	c.entries[k] = n
	c.peak = max(c.peak, len(c.entries))
	c.bytes += size
	c.pushFront(n)
	for c.bytes > c.max && c.tail != nil {
		c.remove(c.tail)
		evicted++
	}
	c.shrink()
	entries, held := len(c.entries), c.bytes
	c.mu.Unlock()
	if c.metrics != nil {
		for range evicted {
			c.metrics.Evicted(EvictedSize)
		}
		c.metrics.Held(entries, held)
	}
	return true
}

// Len returns how many entries the cache holds (live or not yet found
// past their time).
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Bytes returns the bytes the entries hold, as counted against MaxBytes.
func (c *Cache) Bytes() int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// MaxBytes returns the cache's bound (0 for a nil cache).
func (c *Cache) MaxBytes() int64 {
	if c == nil {
		return 0
	}
	return c.max
}

// shrink makes the map again when it holds less than half of the most it
// held: a Go map never gives back the room it grew to, and what an entry
// is counted for covers twice its share of the map, no more.
func (c *Cache) shrink() {
	if len(c.entries) >= c.peak/2 {
		return
	}
	m := make(map[key]*node, len(c.entries))
	for k, n := range c.entries {
		m[k] = n
	}
	c.entries, c.peak = m, len(m)
}

func (c *Cache) remove(n *node) {
	delete(c.entries, n.key)
	c.bytes -= n.size
	c.unlink(n)
}

func (c *Cache) unlink(n *node) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		c.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = nil, nil
}

func (c *Cache) pushFront(n *node) {
	n.prev, n.next = nil, c.head
	if c.head != nil {
		c.head.prev = n
	}
	c.head = n
	if c.tail == nil {
		c.tail = n
	}
}

func (c *Cache) toFront(n *node) {
	if c.head == n {
		return
	}
	c.unlink(n)
	c.pushFront(n)
}

// clone copies what e refers to, so that the cache holds only memory of
// its own (a string cut from a larger buffer would hold all of it).
func clone(e Entry) Entry {
	e.RequestHash, e.RawHash = strings.Clone(e.RequestHash), strings.Clone(e.RawHash)
	e.Status = idem.Status(strings.Clone(string(e.Status)))
	e.Response = cloneResponse(e.Response)
	if e.Record != nil {
		r := *e.Record
		r.Scope = idem.Scope{Tenant: strings.Clone(r.Tenant), Operation: strings.Clone(r.Operation), Key: strings.Clone(r.Key)}
		r.RequestHash, r.RawHash, r.Owner = strings.Clone(r.RequestHash), strings.Clone(r.RawHash), strings.Clone(r.Owner)
		r.Status, r.Checkpoint = idem.Status(strings.Clone(string(r.Status))), idem.Checkpoint(strings.Clone(string(r.Checkpoint)))
		r.ResourceType, r.ResourceID = strings.Clone(r.ResourceType), strings.Clone(r.ResourceID)
		r.ErrorCode, r.HomeRegion = strings.Clone(r.ErrorCode), strings.Clone(r.HomeRegion)
		if r.LockedUntil != nil {
			t := *r.LockedUntil
			r.LockedUntil = &t
		}
		if r.Response != nil {
			resp := cloneResponse(*r.Response)
			r.Response = &resp
		}
		e.Record = &r
	}
	return e
}

func cloneResponse(r idem.Response) idem.Response {
	if r.Headers != nil {
		h := make(map[string]string, len(r.Headers))
		for k, v := range r.Headers {
			h[strings.Clone(k)] = strings.Clone(v)
		}
		r.Headers = h
	}
	r.Body = bytes.Clone(r.Body)
	r.SchemaVersion = strings.Clone(r.SchemaVersion)
	return r
}

// Fixed costs counted for each entry, above what its strings and bytes
// hold: checked against the heap by TestBoundHoldsOnTheHeap.
const (
	// nodeCost is a node (its key, Entry and links: 224 bytes with the
	// size class's rounding) and its share of the map: a slot of 65
	// bytes at the lowest load a map has after it grew (7/16), twice that
	// for the room shrink leaves (300 bytes).
	nodeCost = 576
	// stringCost is what one string's allocation may add to its bytes.
	stringCost = 16
	// headersCost is a header map with up to 8 headers (one group of 8
	// slots of 32 bytes, and the map's own header); headerCost each
	// header's share of a larger one (a slot at the lowest load) on top.
	headersCost = 320
	headerCost  = 80
	// recordCost is an idem.Record (352 bytes) and its Response (64).
	recordCost = 448
)

// sizeOf is what an entry is counted for against the bound.
func sizeOf(k key, e Entry) int64 {
	n := nodeCost + strs(k.Tenant, k.Operation, k.Key, e.RequestHash, e.RawHash, string(e.Status)) + responseSize(e.Response)
	if r := e.Record; r != nil {
		n += recordCost + strs(r.Tenant, r.Operation, r.Key, r.RequestHash, r.RawHash, string(r.Status), string(r.Checkpoint),
			r.Owner, r.ResourceType, r.ResourceID, r.ErrorCode, r.HomeRegion)
		if r.Response != nil {
			n += responseSize(*r.Response)
		}
	}
	return int64(n)
}

func responseSize(r idem.Response) int {
	n := strs(r.SchemaVersion)
	if len(r.Body) > 0 {
		// Allocations round up to a size class, by at most an eighth.
		n += len(r.Body) + len(r.Body)/8 + stringCost
	}
	if r.Headers != nil {
		n += headersCost
		if len(r.Headers) > 8 {
			n += headerCost * len(r.Headers)
		}
		for k, v := range r.Headers {
			n += strs(k, v)
		}
	}
	return n
}

func strs(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n += len(s) + stringCost
		}
	}
	return n
}

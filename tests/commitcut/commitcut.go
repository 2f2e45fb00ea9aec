// Package commitcut loses the answer to a commit on purpose, for tests of
// ambiguous commits: a toxiproxy proxy (in process) in front of a PostgreSQL
// server, carrying a toxic on the server-to-client stream that, at the armed
// commit's answer, drops it and closes the client's connection. The server
// answered, so the transaction committed; the client sees its connection
// fail with the commit in flight and cannot know the outcome.
//
// A commit is a COMMIT, or a statement of at least one row that is a
// transaction of its own: its CommandComplete (INSERT, UPDATE or DELETE of
// at least one row, or a SELECT of at least one, which is how a claim
// that inserts in a WITH clause and returns its row is tagged) followed by
// ReadyForQuery with the idle status, which the server sends once it has
// committed. A read of no row is never a commit.
//
// toxiproxy instantiates toxics from a process-wide registry by type name,
// so the toxic type is registered once per process and each proxy's state
// is found through its id.
package commitcut

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// toxicType is the toxiproxy type name of the toxic.
const toxicType = "idem_commit_cut"

var (
	registerOnce sync.Once
	cuts         sync.Map // id -> *Cut
	nextID       atomic.Int64
)

// commitAnswer is the server's CommandComplete message for COMMIT.
var commitAnswer = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

// idle is ReadyForQuery with the status "not in a transaction block".
var idle = []byte("Z\x00\x00\x00\x05I")

// isCommit reports whether chunk answers a commit: a COMMIT, or a write
// of at least one row that ended its implicit transaction.
func isCommit(chunk []byte) bool {
	if bytes.Contains(chunk, commitAnswer) {
		return true
	}
	for i := 0; i+5 <= len(chunk); i++ {
		if chunk[i] != 'C' {
			continue
		}
		n := int(binary.BigEndian.Uint32(chunk[i+1 : i+5]))
		end := i + 1 + n
		if n < 5 || end > len(chunk) || chunk[end-1] != 0 {
			continue
		}
		tag := string(chunk[i+5 : end-1])
		if writeTag(tag) && bytes.HasPrefix(chunk[end:], idle) {
			return true
		}
	}
	return false
}

// writeTag reports whether a CommandComplete tag is a statement of at
// least one row that may have written ("INSERT 0 1", "UPDATE 3",
// "DELETE 1", "SELECT 1").
func writeTag(tag string) bool {
	f := strings.Fields(tag)
	switch {
	case len(f) == 3 && f[0] == "INSERT":
		return f[2] != "0"
	case len(f) == 2 && (f[0] == "UPDATE" || f[0] == "DELETE" || f[0] == "SELECT"):
		return f[1] != "0"
	}
	return false
}

// Cut is one proxy and its arming state.
type Cut struct {
	// URL is the database URL through the proxy.
	URL string

	mu      sync.Mutex
	armedAt int // the commit answer (1-based, counted from arming) to drop; 0: disarmed
	seen    int
	done    chan struct{}
}

// New starts a proxy in front of dbURL's server; it is removed in
// tb.Cleanup. Nothing is cut until Arm.
func New(tb testing.TB, dbURL string) *Cut {
	tb.Helper()
	registerOnce.Do(func() { toxics.Register(toxicType, new(toxic)) })
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("commitcut: %v", err)
	}
	id := fmt.Sprint(nextID.Add(1))
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "store-"+id, "127.0.0.1:0", u.Host)
	if err := srv.Collection.Add(proxy, true); err != nil {
		tb.Fatalf("commitcut: start proxy: %v", err)
	}
	tb.Cleanup(func() { _ = srv.Collection.Remove(proxy.Name) })
	c := &Cut{done: make(chan struct{})}
	cuts.Store(id, c)
	tb.Cleanup(func() { cuts.Delete(id) })
	body := `{"name":"commit_cut","type":"` + toxicType + `","stream":"downstream","attributes":{"id":"` + id + `"}}`
	if _, err := proxy.Toxics.AddToxicJson(bytes.NewReader([]byte(body))); err != nil {
		tb.Fatalf("commitcut: add toxic: %v", err)
	}
	u.Host = proxy.Listen
	c.URL = u.String()
	return c
}

// Arm makes the n-th commit's answer from now get lost (n >= 1). The channel
// it returns is closed when that happened.
func (c *Cut) Arm(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armedAt, c.seen, c.done = n, 0, make(chan struct{})
	return c.done
}

// Cut reports whether the armed commit's answer was dropped.
func (c *Cut) Cut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// drop counts a commit's answer in chunk and reports whether it is the armed one.
func (c *Cut) drop(chunk []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armedAt == 0 || !isCommit(chunk) {
		return false
	}
	c.seen++
	if c.seen != c.armedAt {
		return false
	}
	c.armedAt = 0
	close(c.done)
	return true
}

// toxic is the toxiproxy side of a Cut.
type toxic struct {
	ID string `json:"id"`
}

// Pipe implements toxics.Toxic.
func (t *toxic) Pipe(stub *toxics.ToxicStub) {
	v, _ := cuts.Load(t.ID)
	c, _ := v.(*Cut)
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			if c != nil && c.drop(chunk.Data) {
				stub.Close()
				return
			}
			stub.Output <- chunk
		}
	}
}

// Package commitcut loses the answer to a COMMIT on purpose, for tests of
// ambiguous commits: a toxiproxy proxy (in process) in front of a PostgreSQL
// server, carrying a toxic on the server-to-client stream that, at the armed
// COMMIT answer, drops it and closes the client's connection. The server
// answered, so the transaction committed; the client sees its connection
// fail with COMMIT in flight and cannot know the outcome.
//
// toxiproxy instantiates toxics from a process-wide registry by type name,
// so the toxic type is registered once per process and each proxy's state
// is found through its id.
package commitcut

import (
	"bytes"
	"fmt"
	"net/url"
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

// Cut is one proxy and its arming state.
type Cut struct {
	// URL is the database URL through the proxy.
	URL string

	mu      sync.Mutex
	armedAt int // the COMMIT answer (1-based, counted from arming) to drop; 0: disarmed
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

// Arm makes the n-th COMMIT answer from now get lost (n >= 1). The channel
// it returns is closed when that happened.
func (c *Cut) Arm(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armedAt, c.seen, c.done = n, 0, make(chan struct{})
	return c.done
}

// Cut reports whether the armed COMMIT answer was dropped.
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

// drop counts a COMMIT answer in chunk and reports whether it is the armed one.
func (c *Cut) drop(chunk []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armedAt == 0 || !bytes.Contains(chunk, commitAnswer) {
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

// Package commitcut is a PostgreSQL-protocol fault proxy for tests of
// ambiguous commits and retry storms: a toxiproxy proxy (in process) in
// front of a PostgreSQL server, with a toxic on each stream that reads the
// protocol's messages and, armed for the n-th occurrence, does what
// CockroachDB may do to a client:
//
//   - Arm (CutCommit): lose the answer to a commit and close the client's
//     connection. The server answered, so the transaction committed; the
//     client sees its connection fail with the commit in flight.
//   - ArmFault(AmbiguousCommit): answer a commit with SQLSTATE 40003
//     ("result is ambiguous") instead of the server's CommandComplete; the
//     server committed, and ReadyForQuery keeps its idle status.
//   - ArmFault(AmbiguousRelease), ArmFault(CutRelease): under cockroach-go's
//     crdbpgx.ExecuteTx the commit is RELEASE SAVEPOINT cockroach_restart;
//     on PostgreSQL RELEASE commits nothing, so the proxy makes the server
//     commit there as CockroachDB does (it sends the RELEASE followed by a
//     COMMIT), swallows both answers, and then answers 40003 with
//     ReadyForQuery in the failed-transaction status, or closes the
//     client's connection (the RELEASE's answer lost).
//   - Storm: the server answers 40001 (a serialization failure) to each of a
//     run of statements: the proxy replaces each with a statement that
//     raises it, so the server's transaction really fails as CockroachDB's
//     would (aborted inside a transaction block, rolled back at a COMMIT).
//
// A commit is a COMMIT (CommandComplete tagged COMMIT), or a write of at
// least one row that is a transaction of its own: its CommandComplete
// (INSERT, UPDATE or DELETE of at least one row) followed by ReadyForQuery
// with the idle status, which the server sends once it has committed. A
// read is never a commit, even alone (SELECT version() on a new connection
// is not).
//
// The proxy speaks the protocol without TLS: the URL it gives says
// sslmode=disable. toxiproxy instantiates toxics from a process-wide
// registry by type name, so the toxic types are registered once per process
// and each proxy's state is found through its id.
package commitcut

import (
	"bytes"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Toxic type names: the server-to-client and client-to-server sides.
const (
	downstreamType = "idem_pg_fault_downstream"
	upstreamType   = "idem_pg_fault_upstream"
)

var (
	registerOnce sync.Once
	cuts         sync.Map // id -> *Cut
	nextID       atomic.Int64
)

// Fault is what the proxy does to the armed occurrence.
type Fault int

const (
	// CutCommit loses a commit's answer and closes the client's connection.
	CutCommit Fault = iota + 1
	// AmbiguousCommit answers a commit with 40003; the server committed.
	AmbiguousCommit
	// AmbiguousRelease makes RELEASE SAVEPOINT commit and answers it 40003.
	AmbiguousRelease
	// CutRelease makes RELEASE SAVEPOINT commit and loses its answer.
	CutRelease
)

func (f Fault) String() string {
	switch f {
	case CutCommit:
		return "cut-commit"
	case AmbiguousCommit:
		return "ambiguous-commit"
	case AmbiguousRelease:
		return "ambiguous-release"
	case CutRelease:
		return "cut-release"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// onRelease reports whether f is armed on RELEASE SAVEPOINT statements
// (counted as the client sends them) rather than on commit answers
// (counted as the server sends them).
func (f Fault) onRelease() bool { return f == AmbiguousRelease || f == CutRelease }

// Cut is one proxy and its arming state.
type Cut struct {
	// URL is the database URL through the proxy.
	URL string

	mu      sync.Mutex
	fault   Fault // armed fault; 0: none
	armedAt int   // the occurrence (1-based, counted from arming) to hit
	seen    int
	done    chan struct{}

	storm      string // statement prefix (normalised) a storm answers; "" none
	stormLeft  int
	stormed    int
	stormQuiet chan struct{}
}

// New starts a proxy in front of dbURL's server; it is removed in
// tb.Cleanup. Nothing is done to the traffic until armed.
func New(tb testing.TB, dbURL string) *Cut {
	tb.Helper()
	registerOnce.Do(func() {
		toxics.Register(downstreamType, new(downstream))
		toxics.Register(upstreamType, new(upstream))
	})
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
	c := &Cut{done: make(chan struct{}), stormQuiet: make(chan struct{})}
	cuts.Store(id, c)
	tb.Cleanup(func() { cuts.Delete(id) })
	for _, tx := range []struct{ name, typ, stream string }{
		{"pg_fault_down", downstreamType, "downstream"},
		{"pg_fault_up", upstreamType, "upstream"},
	} {
		body := `{"name":"` + tx.name + `","type":"` + tx.typ + `","stream":"` + tx.stream + `","attributes":{"id":"` + id + `"}}`
		if _, err := proxy.Toxics.AddToxicJson(bytes.NewReader([]byte(body))); err != nil {
			tb.Fatalf("commitcut: add toxic: %v", err)
		}
	}
	u.Host = proxy.Listen
	q := u.Query()
	q.Set("sslmode", "disable") // the toxics read the protocol in the clear
	u.RawQuery = q.Encode()
	c.URL = u.String()
	return c
}

// Arm makes the n-th commit's answer from now get lost, with the client's
// connection closed (n >= 1): ArmFault(CutCommit, n).
func (c *Cut) Arm(n int) <-chan struct{} { return c.ArmFault(CutCommit, n) }

// ArmFault arms f for its n-th occurrence from now (n >= 1): the n-th
// commit answer for CutCommit and AmbiguousCommit, the n-th RELEASE
// SAVEPOINT the client sends for AmbiguousRelease and CutRelease. The
// channel it returns is closed when the fault was done. Arming replaces
// whatever was armed before.
func (c *Cut) ArmFault(f Fault, n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fault, c.armedAt, c.seen, c.done = f, n, 0, make(chan struct{})
	return c.done
}

// Cut reports whether the armed fault was done.
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

// Storm makes the server answer 40001 to each of the next n statements
// whose text starts with prefix (case and surrounding space aside; n < 0:
// every one until Storm is called again, n == 0 ends a storm). The channel
// it returns is closed once n have been answered so.
func (c *Cut) Storm(prefix string, n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.storm, c.stormLeft, c.stormed, c.stormQuiet = normalize(prefix), n, 0, make(chan struct{})
	if n == 0 {
		c.storm = ""
		close(c.stormQuiet)
	}
	return c.stormQuiet
}

// Stormed reports how many statements the current storm has answered 40001.
func (c *Cut) Stormed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stormed
}

// hit counts an occurrence of a commit answer (release false) or of a
// RELEASE SAVEPOINT (release true) and reports the fault to do to it, 0
// when none.
func (c *Cut) hit(release bool) Fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault == 0 || c.fault.onRelease() != release {
		return 0
	}
	c.seen++
	if c.seen != c.armedAt {
		return 0
	}
	f := c.fault
	c.fault = 0
	close(c.done)
	return f
}

// stormHit reports whether a statement with normalised text sql is to be
// answered 40001, and counts it.
func (c *Cut) stormHit(sql string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storm == "" || !hasPrefixFold(sql, c.storm) {
		return false
	}
	c.stormed++
	if c.stormLeft > 0 {
		c.stormLeft--
		if c.stormLeft == 0 {
			c.storm = ""
			close(c.stormQuiet)
		}
	}
	return true
}

func lookup(id string) *Cut {
	v, _ := cuts.Load(id)
	c, _ := v.(*Cut)
	return c
}

// downstream is the server-to-client toxic.
type downstream struct {
	ID string `json:"id"`
}

// NewState implements toxics.StatefulToxic: each connection's reader.
func (t *downstream) NewState() any { return &downState{} }

// Pipe implements toxics.Toxic.
func (t *downstream) Pipe(stub *toxics.ToxicStub) {
	c := lookup(t.ID)
	st, _ := stub.State.(*downState)
	pipe(stub, func(data []byte) ([]byte, bool) {
		if c == nil || st == nil {
			return data, false
		}
		return st.feed(c, data)
	})
}

// upstream is the client-to-server toxic.
type upstream struct {
	ID string `json:"id"`
}

// NewState implements toxics.StatefulToxic: each connection's reader.
func (t *upstream) NewState() any { return &upState{startup: true} }

// Pipe implements toxics.Toxic.
func (t *upstream) Pipe(stub *toxics.ToxicStub) {
	c := lookup(t.ID)
	st, _ := stub.State.(*upState)
	pipe(stub, func(data []byte) ([]byte, bool) {
		if c == nil || st == nil {
			return data, false
		}
		return st.feed(c, data), false
	})
}

// pipe moves stub's chunks through feed, which returns what to pass on and
// whether to close the connection after it.
func pipe(stub *toxics.ToxicStub, feed func([]byte) ([]byte, bool)) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			out, closeConn := feed(chunk.Data)
			if len(out) > 0 {
				stub.Output <- &stream.StreamChunk{Data: out, Timestamp: chunk.Timestamp}
			}
			if closeConn {
				stub.Close()
				return
			}
		}
	}
}

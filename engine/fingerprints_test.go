package engine_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/storetest"
)

// parses counts the commands a test's requests parsed.
type parses struct{ n atomic.Int32 }

// errUnparsed wraps the error of a body that does not parse.
var errUnparsed = errors.New("test: the body does not parse")

// request is a request of key whose body is body: its raw hash, and a
// Fingerprint that parses body as one JSON object and counts the parse.
func (p *parses) request(key, body string) engine.Request {
	req := request(key, nil)
	req.RawHash = fingerprint.RawHash(opName, []byte(body))
	req.Fingerprint = func() ([]string, error) {
		p.n.Add(1)
		doc, err := fingerprint.ParseObject([]byte(body))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUnparsed, err)
		}
		return fingerprint.Hashes(opName, doc)
	}
	return req
}

// executedOnce checks that c counted one execution.
func executedOnce(t *testing.T, c *counting) {
	t.Helper()
	if n := c.n.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// TestByteEqualRetryIsNotParsed: with the answer kept in memory, a retry
// whose bytes equal the first request's is replayed without its command
// being parsed; a re-serialised retry of the same command (members in
// another order, 10.0 for 10.00) is parsed and replayed; a different
// command is parsed and refused; a body that does not parse gets its own
// error, not a refusal; and the record stores the first request's raw hash.
func TestByteEqualRetryIsNotParsed(t *testing.T) {
	st, _ := storetest.New(t)
	var c counting
	e := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}, engine.Operation{Execute: c.execute})
	ctx := ctxOf(t)
	var p parses
	const first = `{"amount":10.00,"currency":"EUR","account":"acc_1"}`
	orig, err := e.Do(ctx, p.request("k", first))
	if err != nil || !orig.Executed {
		t.Fatalf("first request: %+v, %v", orig, err)
	}
	if got := p.n.Load(); got != 1 {
		t.Fatalf("the first request parsed %d times, want 1", got)
	}
	if got, want := record(t, st, "k").RawHash, fingerprint.RawHash(opName, []byte(first)); got != want {
		t.Errorf("stored raw hash = %q, want the first request's %q", got, want)
	}

	ans, err := e.Do(ctx, p.request("k", first))
	if err != nil || !ans.Replayed {
		t.Fatalf("byte-equal retry: %+v, %v", ans, err)
	}
	sameAnswer(t, "byte-equal retry", ans, engine.Answer{Response: orig.Response, Status: idem.StatusCompleted, Replayed: true, Outcome: idem.OutcomeReplay})
	if got := p.n.Load(); got != 1 {
		t.Errorf("a byte-equal retry was parsed (%d parses in all, want 1)", got)
	}

	ans, err = e.Do(ctx, p.request("k", `{"account":"acc_1", "currency":"EUR", "amount":10.0}`))
	if err != nil || !ans.Replayed {
		t.Fatalf("re-serialised retry: %+v, %v", ans, err)
	}
	if got := p.n.Load(); got != 2 {
		t.Errorf("a re-serialised retry parsed %d times, want once", got-1)
	}

	_, err = e.Do(ctx, p.request("k", `{"amount":10.01,"currency":"EUR","account":"acc_1"}`))
	if idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Errorf("another command: %v, want %s", err, idem.ECodeKeyReused)
	}

	if _, err = e.Do(ctx, p.request("k", `{"amount":10.00,`)); !errors.Is(err, errUnparsed) {
		t.Errorf("a body that does not parse: %v, want the parse's error", err)
	}
	executedOnce(t, &c)
}

// TestRecordWithoutRawHashReplays: a record claimed without a raw hash (as
// every record written before migration 0012 was: raw_hash NULL) replays
// by its request hash; its answer is then kept with the raw hash of the
// request that read it, so the next byte-equal retry replays from memory
// unparsed; and a different command is still refused.
func TestRecordWithoutRawHashReplays(t *testing.T) {
	st, _ := storetest.New(t)
	var c counting
	op, ctx := engine.Operation{Execute: c.execute}, ctxOf(t)
	const body = `{"amount":"10.00","currency":"EUR"}`
	old := newEngine(t, st, engine.Options{}, op)
	h := hashes(t, map[string]any{"amount": "10.00", "currency": "EUR"})
	orig, err := old.Do(ctx, request("k", h))
	if err != nil {
		t.Fatal(err)
	}
	if rec := record(t, st, "k"); rec.RawHash != "" {
		t.Fatalf("a record claimed without a raw hash stores %q", rec.RawHash)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'k' AND raw_hash IS NULL`); n != 1 {
		t.Fatalf("raw_hash is not NULL")
	}

	// A node with the answer cache: the retry finds no raw hash to
	// compare, and its request hash decides.
	e := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}, op)
	var p parses
	for _, what := range []string{"from the store", "from memory"} {
		ans, err := e.Do(ctx, p.request("k", body))
		if err != nil || !ans.Replayed {
			t.Fatalf("retry %s: %+v, %v", what, ans, err)
		}
		sameAnswer(t, "retry "+what, ans, engine.Answer{Response: orig.Response, Status: idem.StatusCompleted, Replayed: true, Outcome: idem.OutcomeReplay})
		if p.n.Load() != 1 {
			t.Errorf("after the retry %s, %d parses, want 1 (the answer is kept with the raw hash of the request that read it)", what, p.n.Load())
		}
	}
	if _, err := e.Do(ctx, p.request("k", `{"amount":"10.01","currency":"EUR"}`)); idem.ErrorCode(err) != idem.ECodeKeyReused {
		t.Errorf("another command: %v, want %s", err, idem.ECodeKeyReused)
	}
	executedOnce(t, &c)
}

// TestAnswerReadKeepsTheStoredRawHash: a node that reads a settled record
// (another node claimed it) keeps its answer with the raw hash the record
// stores, the first request's, even when the retry that read it was a
// re-serialisation: the first request's bytes then replay from memory
// unparsed.
func TestAnswerReadKeepsTheStoredRawHash(t *testing.T) {
	st, _ := storetest.New(t)
	var (
		c counting
		p parses
	)
	op, ctx := engine.Operation{Execute: c.execute}, ctxOf(t)
	const first = `{"amount":10.00,"currency":"EUR"}`
	if _, err := newEngine(t, st, engine.Options{}, op).Do(ctx, p.request("k", first)); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, st, engine.Options{AnswerCache: engine.AnswerCache{Bytes: 1 << 20}}, op)
	if ans, err := e.Do(ctx, p.request("k", `{"currency":"EUR","amount":10.0}`)); err != nil || !ans.Replayed {
		t.Fatalf("re-serialised retry: %+v, %v", ans, err)
	}
	parsed := p.n.Load()
	if ans, err := e.Do(ctx, p.request("k", first)); err != nil || !ans.Replayed {
		t.Fatalf("first request's bytes: %+v, %v", ans, err)
	}
	if p.n.Load() != parsed {
		t.Errorf("the first request's bytes were parsed again")
	}
}

// TestExpiredTakeoverStoresItsRawHash: a key reused after its window is a
// new command, and its record stores the new request's raw hash (the old
// one is not kept beside the new command's request hash).
func TestExpiredTakeoverStoresItsRawHash(t *testing.T) {
	st, _ := storetest.New(t)
	var c counting
	e := newEngine(t, st, engine.Options{}, engine.Operation{Execute: c.execute})
	ctx := ctxOf(t)
	var p parses
	if _, err := e.Do(ctx, p.request("k", `{"amount":1}`)); err != nil {
		t.Fatal(err)
	}
	storetest.Exec(t, st, `UPDATE idempotency_records SET expires_at = now() - INTERVAL '1 second' WHERE idempotency_key = 'k'`)
	const second = `{"amount":2}`
	if ans, err := e.Do(ctx, p.request("k", second)); err != nil || !ans.ExpiredRetry {
		t.Fatalf("reuse after the window: %+v, %v", ans, err)
	}
	if got, want := record(t, st, "k").RawHash, fingerprint.RawHash(opName, []byte(second)); got != want {
		t.Errorf("raw hash after the takeover = %q, want the new request's %q", got, want)
	}
	// And a takeover that is not a new command keeps the record's.
	storetest.Exec(t, st, `UPDATE idempotency_records SET status = 'FAILED_RETRYABLE', checkpoint = 'RECEIVED' WHERE idempotency_key = 'k'`)
	if _, err := e.Do(ctx, p.request("k", ` {"amount":2}`)); err != nil {
		t.Fatal(err)
	}
	if got, want := record(t, st, "k").RawHash, fingerprint.RawHash(opName, []byte(second)); got != want {
		t.Errorf("raw hash after a recovery takeover = %q, want the record's %q", got, want)
	}
}

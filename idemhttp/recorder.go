package idemhttp

import (
	"bytes"
	"context"
	"net/http"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/httpanswer"
)

// recorder captures a handler's answer, keeping at most limit body bytes,
// or passes it on to client after PassThrough.
type recorder struct {
	header   http.Header
	status   int
	buf      bytes.Buffer
	limit    int
	overflow bool
	class    idem.Status
	// stored: the handler recorded its answer itself (Stored); err: it
	// failed (Fail).
	stored bool
	err    error
	// client is the middleware's writer (nil: no pass-through allowed);
	// passing: PassThrough was called; sent: the status went out to client.
	client  http.ResponseWriter
	passing bool
	sent    bool
}

func newRecorder(limit int, client http.ResponseWriter) *recorder {
	return &recorder{header: http.Header{}, limit: limit, client: client}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
	if r.passing && !r.sent {
		r.send()
	}
}

// send writes the status and headers to the client.
func (r *recorder) send() {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	for k, v := range r.header {
		r.client.Header()[k] = v
	}
	r.client.WriteHeader(r.status)
	r.sent = true
}

// Write keeps the body up to the limit; beyond it the answer is marked
// overflowing and further bytes are dropped (the handler still runs to its
// end, so that its effects are whole). After PassThrough it writes to the
// client.
func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.passing {
		return r.client.Write(p)
	}
	if r.overflow || r.buf.Len()+len(p) > r.limit {
		r.overflow = true
		r.buf.Reset()
		return len(p), nil
	}
	return r.buf.Write(p)
}

// FlushError flushes a passed-through answer to the client
// (http.ResponseController's Flush); a buffered answer has nothing to
// flush.
func (r *recorder) FlushError() error {
	if !r.passing {
		return nil
	}
	if !r.sent {
		r.send()
	}
	return http.NewResponseController(r.client).Flush()
}

// PassThrough makes the rest of the answer the handler is writing to w go
// straight to the client, as it is written, instead of being buffered for
// the record: for an answer larger than Options.MaxResponseBody, or a
// stream (text/event-stream) that must reach the client as it arrives.
// Call it before writing; whatever was already written is sent first.
// Flushing w (http.NewResponseController(w).Flush) flushes to the client.
//
// The record is settled by the answer's class (Classify, or DefaultClass
// of its status) as a buffered answer's would be, but stores the status
// and Options.ReplayHeaders without the body (Response.SchemaVersion
// NotStoredSchema): a retry with the same key gets 410
// IDEMPOTENCY_RESPONSE_NOT_STORED, and the handler does not run again. A
// FAILED_RETRYABLE answer is not stored, as always, so its retry executes
// again. Once the status is out, Fail still settles the record but the
// client keeps what it got, and an error of the record's write is logged,
// not answered. On a writer that is not the middleware's, or after the
// answer overflowed, it does nothing.
func PassThrough(w http.ResponseWriter) {
	r := recorderOf(w)
	if r == nil || r.client == nil || r.overflow || r.passing {
		return
	}
	r.passing = true
	if r.status != 0 {
		r.send()
		_, _ = r.client.Write(r.buf.Bytes())
		r.buf.Reset()
	}
}

// NotStoredSchema is the Response.SchemaVersion of an answer recorded
// without its body (PassThrough, or an upstream's answer the sidecar passed
// on): its record is settled, and a retry answers 410
// IDEMPOTENCY_RESPONSE_NOT_STORED instead of a replay. GET
// /v1/idempotency/records shows it as responseSchemaVersion.
const NotStoredSchema = httpanswer.NotStoredSchema

// Classify sets how the answer the handler is writing to w is stored:
// idem.StatusCompleted, idem.StatusFailedReplayable (stored and replayed),
// idem.StatusFailedRetryable (not stored: a retry executes again, so the
// handler must have had no side effect) or idem.StatusUnknown (a side effect
// may have happened; only Options.Recover may settle it). It overrides
// DefaultClass. On a writer that is not the middleware's it does nothing.
func Classify(w http.ResponseWriter, s idem.Status) {
	if r := recorderOf(w); r != nil {
		r.class = s
	}
}

// Stored says that the handler has recorded its answer in the record
// itself, as state s, in the transaction of its own writes (see
// engine.Result.Stored): the middleware then writes nothing to the record,
// and answers what the handler writes to w (or, after Fail, the error). It
// sets the class as Classify does. On a writer that is not the
// middleware's it does nothing.
func Stored(w http.ResponseWriter, s idem.Status) {
	if r := recorderOf(w); r != nil {
		r.class, r.stored = s, true
	}
}

// Fail reports that the handler failed with err: the engine gets err (so
// an *idem.Error keeps its code, idem.ErrFenced stays fenced, and an
// unclassified error leaves the record for recovery unless Stored was
// called) and the client the error answer (Options.Errors). Whatever
// the handler wrote to w is dropped. On a writer that is not the
// middleware's it does nothing.
func Fail(w http.ResponseWriter, err error) {
	if r := recorderOf(w); r != nil {
		r.err = err
	}
}

// recorderOf returns the middleware's recorder under w, or nil.
func recorderOf(w http.ResponseWriter) *recorder {
	for {
		switch v := w.(type) {
		case *recorder:
			return v
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return nil
		}
	}
}

type valueKey struct{}

// ValueFrom returns the Value of the request's Command (Hooks.Command)
// inside the handler, or nil.
func ValueFrom(ctx context.Context) any {
	return ctx.Value(valueKey{})
}

type attemptKey struct{}

func withAttempt(ctx context.Context, a *engine.Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// AttemptFrom returns the engine attempt a handler runs under (its lease
// and fencing token, for checkpoints and downstream calls), or nil outside
// the middleware.
func AttemptFrom(ctx context.Context) *engine.Attempt {
	a, _ := ctx.Value(attemptKey{}).(*engine.Attempt)
	return a
}

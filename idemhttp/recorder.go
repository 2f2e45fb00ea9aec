package idemhttp

import (
	"bytes"
	"context"
	"net/http"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// recorder captures a handler's answer, keeping at most limit body bytes.
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
}

func newRecorder(limit int) *recorder {
	return &recorder{header: http.Header{}, limit: limit}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// Write keeps the body up to the limit; beyond it the answer is marked
// overflowing and further bytes are dropped (the handler still runs to its
// end, so that its effects are whole).
func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.overflow || r.buf.Len()+len(p) > r.limit {
		r.overflow = true
		r.buf.Reset()
		return len(p), nil
	}
	return r.buf.Write(p)
}

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

// ValueFrom returns the Value of the request's Command (Options.Command)
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

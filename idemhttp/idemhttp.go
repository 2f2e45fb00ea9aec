// Package idemhttp makes any net/http handler idempotent with the engine of
// package engine: wrap the handler of one operation, and requests with the
// same Idempotency-Key in the same tenant execute it once.
//
//	mw, err := idemhttp.Middleware(eng, idemhttp.Options{
//		Operation: "create_transfer",
//		Tenant:    func(r *http.Request) (string, error) { return tenantOf(r) },
//	})
//	mux.Handle("POST /transfers", mw(transferHandler))
//
// The contract is the one docs/http-api.md describes: Idempotency-Key is
// required (400
// IDEMPOTENCY_KEY_MISSING or IDEMPOTENCY_KEY_INVALID); a replay answers the
// stored status, stored headers and body byte for byte with
// Idempotent-Replayed: true; the same key with a different request answers
// 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST without calling the
// handler; a key in progress answers 409 IDEMPOTENCY_REQUEST_IN_PROGRESS with
// Retry-After, or waits for the answer when the client sends Prefer: wait=N
// (PreferWait);
// every answer carries Idempotency-Window (seconds). Errors are RFC 9457
// problems (application/problem+json) that also carry errorCode and
// message, written by one table of codes ([Errors]) that every surface of
// the service shares.
//
// The handler's answer is buffered (up to Options.MaxResponseBody), stored,
// and only then sent. How it is stored depends on its class, which the
// handler may set with [Classify]; by default a 2xx or 3xx answer is
// COMPLETED, a 4xx other than 408, 409, 425 and 429 is FAILED_REPLAYABLE
// (stored and replayed), and 408, 409, 425, 429 and 5xx are FAILED_RETRYABLE:
// sent to this client but not stored, so a retry executes again. A handler
// whose answer is too large to store, or a stream, calls [PassThrough]
// first: its answer then goes to the client as it is written, and the
// record is settled without the body, so a retry answers 410
// IDEMPOTENCY_RESPONSE_NOT_STORED instead of executing again.
//
// The middleware must run inside the route (mux.Handle(pattern, mw(h))) so
// that the request's pattern and path values are known; outside a mux the
// route is the URL path.
//
// An operation that owns more of its path (a node's own operations are)
// parses its requests itself (Hooks.Command: its fingerprint, a
// claim that writes its rows with the record, a value for the handler,
// ValueFrom), records its results with its own writes (Stored), hands the
// engine its errors (Fail), and answers with its service's error writer
// and metrics (Options.Errors, Hooks.Observe).
package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/httpanswer"
	"github.com/idemcoord/idem/internal/strictjson"
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes    = 1 << 20
	DefaultMaxResponseBody = 1 << 20
)

// Header names of the contract.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
	HeaderWindow   = "Idempotency-Window"
)

// FingerprintFunc returns the normalised command of a request: the fields
// fingerprint.Hashes hashes (with the operation name). body is the whole
// request body, already read.
type FingerprintFunc func(r *http.Request, body []byte) (map[string]any, error)

// Options configure Middleware.
type Options struct {
	// Operation is the operation's name, the scope's middle part
	// (required). Middleware registers it with the engine unless the
	// engine has it already (a registration of the service's own, or
	// another route's Middleware: routes may share an operation).
	Operation string
	// Tenant returns the tenant of an authenticated request (required;
	// BearerTokens maps bearer tokens to tenants). An error (or "")
	// answers 401 UNAUTHENTICATED and stores nothing. There is no default,
	// because the tenant must come from the authenticated principal, never
	// from a client-chosen field.
	Tenant func(r *http.Request) (string, error)
	// Fingerprint normalises a request. Default: the method, the route
	// pattern (r.Pattern, or the URL path outside a mux), the path values
	// of the pattern's wildcards, the SemanticHeaders present, and the body
	// parsed as one strict JSON object (package strictjson's rules, exact
	// numbers; an empty body is null), hashed under fingerprint version 2.
	// A body that is not such an object answers 422 and stores nothing.
	Fingerprint FingerprintFunc
	// SemanticHeaders are request headers that change a request's meaning
	// and so are part of its fingerprint. Default: Api-Version.
	SemanticHeaders []string
	// RawHash returns a request's raw hash (fingerprint.RawHash over its
	// body and every other input Fingerprint reads): a retry with the raw
	// hash its key's answer is kept with in the engine's memory is
	// replayed without Fingerprint being called, and any other request is
	// fingerprinted. It must name every input Fingerprint reads, or two
	// different commands could replay as one. Default: with the default
	// Fingerprint, DefaultRawHash with the same SemanticHeaders; with
	// another, none (every request is fingerprinted).
	RawHash func(r *http.Request, body []byte) string
	// ReplayHeaders are the response headers stored and replayed (the
	// first value of each; Set-Cookie only when named). Default:
	// Content-Type, Content-Encoding and Location.
	ReplayHeaders []string
	// Window is the replay window. Default engine.DefaultWindow (24h).
	Window time.Duration
	// LockFor bounds one execution of the handler (its context ends
	// then) and is how long a crashed owner blocks a retry. Default
	// engine.DefaultLockFor (30s).
	LockFor time.Duration
	// MaxWait caps the wait a client states with Prefer: wait=N (read by
	// PreferWait) and Wait. Default engine.DefaultMaxWait (60s). The
	// middleware leaves the connection's write deadline alone: behind an
	// http.Server with a WriteTimeout, a held request must fit in it, or
	// the server moves its deadline by the stated wait (PreferWait), as a
	// node's server does.
	MaxWait time.Duration
	// Wait is how long a request that finds its key in progress is held
	// for the first answer when it does not ask itself (Prefer: wait=N,
	// which takes precedence): clients whose retry loop stops on a 409
	// (most SDKs) then get the answer instead. Capped by MaxWait. Default
	// 0: 409 IDEMPOTENCY_REQUEST_IN_PROGRESS at once.
	Wait time.Duration
	// MaxBodyBytes bounds the request body: larger answers 413
	// REQUEST_BODY_TOO_LARGE and stores nothing, at once, before anything
	// is read, when its Content-Length says so (CheckContentLength).
	// Default 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBody bounds the answer the middleware stores. A handler
	// that writes more has acted but its answer cannot be replayed: the
	// client gets 500 IDEMPOTENCY_RESPONSE_TOO_LARGE, and the record is
	// left UNKNOWN_REQUIRES_RECOVERY (FAILED_RETRYABLE for a retryable
	// class), so a retry is never a silent re-execution; Recover may settle
	// it. A handler that knows its answer is larger (or a stream) calls
	// PassThrough instead. Default 1 MiB.
	MaxResponseBody int
	// Recover, optional, settles a record a crashed or lost execution left
	// behind (see engine.Operation.Recover).
	//
	// Window, LockFor and Recover make the operation's registration:
	// when the engine has the operation already, that registration
	// decides them, and Middleware refuses them set to other values.
	Recover engine.ExecuteFunc
	// Errors is the table error answers are written by (problem+json,
	// RFC 9457, with each code's status and Retry-After). Default
	// DefaultErrors(); a service whose operations declare codes of their
	// own passes its table extended with them (Errors.With).
	Errors *Errors
	// Logger receives internal errors. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, counts the requests by outcome (idemprom.New
	// makes it the counter idemhttp_requests_total{operation,outcome}).
	Metrics Metrics
	// Hooks, optional, are for an operation that owns more of its path.
	Hooks *Hooks
}

// Hooks are the middleware's advanced hooks, for an operation that owns
// more of its path than a handler: its own parsing and claim, its retry
// rule, its own metrics. A plain handler needs none of them.
type Hooks struct {
	// Command replaces Options.Fingerprint: it parses a request into a
	// Command (its fingerprint, and optionally a claim of its own and a
	// value for the handler). An error answers as Fingerprint's do,
	// storing nothing.
	Command func(r *http.Request, body []byte) (Command, error)
	// RetryOn says which errors of an attempt leave the request to be
	// attempted again at once (engine.Request.RetryOn): a commit whose
	// outcome is unknown, whose record then answers what it did.
	RetryOn func(error) bool
	// Observe is called once per request after its answer was written,
	// with what the engine answered (zero for a request refused before
	// it), the error answered, and the time taken.
	Observe func(r *http.Request, ans engine.Answer, err error, d time.Duration)
}

// BearerTokens returns an Options.Tenant that maps bearer tokens
// (Authorization: Bearer <token>) to tenants; an unknown token, or none,
// is refused.
func BearerTokens(tokens map[string]string) func(*http.Request) (string, error) {
	tokens = maps.Clone(tokens)
	return func(r *http.Request) (string, error) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if tenant := tokens[token]; ok && token != "" && tenant != "" {
			return tenant, nil
		}
		return "", errors.New("idemhttp: unknown bearer token")
	}
}

// Command is a request as Hooks.Command parses it.
type Command struct {
	// Fields are the fields fingerprinted under the operation's name
	// (fingerprint.Hashes); Hashes, when set, are used instead, and
	// Fingerprint, when set and neither is, parses the request when the
	// engine first needs its hashes (engine.Request.Fingerprint): not for
	// a retry that RawHash decides. Its error answers as Hooks.Command's
	// do.
	Fields      map[string]any
	Hashes      []string
	Fingerprint func() ([]string, error)
	// RawHash, optional, is the request's raw hash
	// (engine.Request.RawHash; see Options.RawHash).
	RawHash string
	// Claim, when set, claims the key in place of the operation's (an
	// operation that writes its own rows in the claim's transaction; see
	// engine.Request.Claim).
	Claim engine.ClaimFunc
	// Recover, when set, settles this request's takeovers (see
	// engine.Request.Recover).
	Recover engine.ExecuteFunc
	// Value is handed to the handler: ValueFrom(r.Context()).
	Value any
}

type middleware struct {
	eng      *engine.Engine
	opts     Options
	window   string
	requests func(outcome string)
	// unknownCode is the operation's engine.Operation.UnknownCode.
	unknownCode string
}

// Middleware returns a wrapper that makes a handler idempotent as operation
// opts.Operation, which it registers with e. It fails when the options
// cannot work (no operation, no tenant source, an operation the engine
// has already with another Recover, Window or LockFor). It registers no
// metric: the caller makes Options.Metrics (idemprom.New).
func Middleware(e *engine.Engine, opts Options) (func(http.Handler) http.Handler, error) {
	if opts.Operation == "" {
		return nil, errors.New("idemhttp: Options.Operation is required")
	}
	if opts.Tenant == nil {
		return nil, errors.New("idemhttp: Options.Tenant is required (BearerTokens maps bearer tokens to tenants)")
	}
	if opts.Hooks == nil {
		opts.Hooks = &Hooks{}
	}
	if opts.Fingerprint == nil {
		opts.Fingerprint = DefaultFingerprint(opts.SemanticHeaders...)
		if opts.RawHash == nil {
			opts.RawHash = DefaultRawHash(opts.Operation, opts.SemanticHeaders...)
		}
	}
	if opts.ReplayHeaders == nil {
		opts.ReplayHeaders = httpanswer.DefaultReplayHeaders()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxResponseBody <= 0 {
		opts.MaxResponseBody = DefaultMaxResponseBody
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = engine.DefaultMaxWait
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	op, registered := e.Operation(opts.Operation)
	if registered {
		// The registration decides them; a different value here would be
		// ignored without a word.
		if opts.Recover != nil || (opts.Window != 0 && opts.Window != op.Window) || (opts.LockFor != 0 && opts.LockFor != op.LockFor) {
			return nil, fmt.Errorf("idemhttp: operation %q is registered with the engine already, which decides its Recover, Window and LockFor; set them there", opts.Operation)
		}
	} else {
		if err := e.Register(engine.Operation{Name: opts.Operation, Recover: opts.Recover, Window: opts.Window, LockFor: opts.LockFor}); err != nil {
			return nil, fmt.Errorf("idemhttp: %w", err)
		}
		op, _ = e.Operation(opts.Operation)
	}
	m := &middleware{eng: e, opts: opts, window: strconv.FormatInt(int64(op.Window/time.Second), 10), unknownCode: op.UnknownCode}
	if m.opts.Errors == nil {
		m.opts.Errors = DefaultErrors()
	}
	if opts.Metrics != nil {
		m.requests = opts.Metrics.Requests(opts.Operation)
	}
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, h) })
	}, nil
}

func (m *middleware) count(outcome string) {
	if m.requests != nil {
		m.requests(outcome)
	}
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, h http.Handler) {
	start := time.Now()
	var (
		ans  engine.Answer
		sent bool
	)
	err := m.answer(w, r, h, &ans, &sent)
	switch {
	case err != nil && sent:
		// The handler passed its answer through (PassThrough): the client
		// has it, and the error is the record's.
		m.opts.Logger.ErrorContext(r.Context(), "answer passed through to the client, but its record failed",
			"operation", m.opts.Operation, "err", err)
	case err != nil:
		m.opts.Errors.Write(w, r, m.opts.Logger, err)
	}
	if m.opts.Hooks.Observe != nil {
		m.opts.Hooks.Observe(r, ans, err, time.Since(start))
	}
}

// answer serves one request: it writes the answer, or returns the error to
// answer, and sets *ans to what the engine answered and *sent when the
// handler passed its answer through to w.
func (m *middleware) answer(w http.ResponseWriter, r *http.Request, h http.Handler, ans *engine.Answer, sent *bool) error {
	w.Header().Set(HeaderWindow, m.window)
	if err := CheckContentLength(r, m.opts.MaxBodyBytes); err != nil {
		m.count(idem.LabelRejected)
		return err
	}
	tenant, err := m.opts.Tenant(r)
	if err != nil || tenant == "" {
		m.count(idem.LabelRejected)
		w.Header().Set("WWW-Authenticate", "Bearer")
		return &idem.Error{Code: idem.ECodeUnauthenticated, Message: "A valid credential is required.", Err: err}
	}
	key, err := KeyFromHeader(r.Header)
	if err != nil {
		m.count(idem.LabelRejected)
		return err
	}
	body, err := readBody(w, r, m.opts.MaxBodyBytes)
	if err != nil {
		m.count(idem.LabelRejected)
		return err
	}
	cmd, err := m.command(r, body)
	if err != nil {
		m.count(idem.LabelRejected)
		return clientError(err)
	}
	// rejected says the engine's call of cmd.Fingerprint failed: the
	// request does not parse.
	var rejected bool
	parse := cmd.Fingerprint
	if parse != nil {
		parse = func() ([]string, error) {
			hashes, err := cmd.Fingerprint()
			if err != nil {
				rejected = true
				return nil, clientError(err)
			}
			return hashes, nil
		}
	}
	// rec is the answer of the last Execute: the one that answered when
	// ans.Executed.
	var rec *recorder
	*ans, err = m.eng.Do(r.Context(), engine.Request{
		Operation: m.opts.Operation, Tenant: tenant, Key: key, RequestHashes: cmd.Hashes, Wait: m.wait(r.Header),
		RawHash: cmd.RawHash, Fingerprint: parse,
		Claim: cmd.Claim, Recover: cmd.Recover, RetryOn: m.opts.Hooks.RetryOn,
		Execute: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			// An answer passes through to the client at most once.
			client := w
			if *sent {
				client = nil
			}
			rec = newRecorder(m.opts.MaxResponseBody, client)
			ctx = withAttempt(ctx, a)
			if cmd.Value != nil {
				ctx = context.WithValue(ctx, valueKey{}, cmd.Value)
			}
			r2 := r.WithContext(ctx)
			r2.Body = io.NopCloser(bytes.NewReader(body))
			r2.ContentLength = int64(len(body))
			h.ServeHTTP(rec, r2)
			*sent = *sent || rec.sent
			return m.result(rec), rec.err
		},
	})
	switch {
	case err != nil && rejected:
		m.count(idem.LabelRejected)
		return err
	case err != nil:
		m.count(idem.ErrorLabel(err))
		return err
	}
	switch {
	case ans.Replayed:
		m.count("replay")
		return writeStored(w, ans.Response, true)
	case ans.Executed && rec.overflow:
		m.count("error")
		m.opts.Logger.ErrorContext(r.Context(), "answer larger than MaxResponseBody; record left for recovery",
			"operation", m.opts.Operation, "limit", m.opts.MaxResponseBody)
		return idem.Errorf(idem.ECodeResponseTooLarge, "The answer is too large to be stored for replay; retry with the same key later.")
	case ans.Executed && rec.passing:
		m.count(ans.Outcome.String())
		if !rec.sent {
			// PassThrough, and then nothing written.
			rec.send()
			*sent = true
		}
	case ans.Executed:
		m.count(ans.Outcome.String())
		// The first answer: every header the handler set.
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(ans.Response.Status)
		_, _ = w.Write(ans.Response.Body)
	case ans.Stored && ans.Response.Status != 0:
		// The operation recorded its result itself (a claim of its own, or
		// its Recover): its own answer.
		m.count(ans.Outcome.String())
		return writeStored(w, ans.Response, false)
	case ans.Status == idem.StatusUnknown:
		// Recover could not tell yet.
		m.count(ans.Outcome.String())
		return idem.Errorf(m.unknownCode, "The outcome of the request with this idempotency key is not known yet; retry with the same key later.")
	case ans.Status == idem.StatusFailedRetryable:
		// Recover found that nothing happened: the next retry executes.
		m.count(ans.Outcome.String())
		return idem.Errorf(idem.ECodeUnavailable, "The request did not take effect; retry with the same key.")
	default:
		// Settled by a claim of the operation's own or by its Recover:
		// what it answered.
		m.count(ans.Outcome.String())
		return writeStored(w, ans.Response, false)
	}
	return nil
}

// command is a request's Command: Hooks.Command's, or Options.Fingerprint
// to be called when the engine needs it, with Options.RawHash's raw hash.
// Fields are hashed at once.
func (m *middleware) command(r *http.Request, body []byte) (Command, error) {
	if m.opts.Hooks.Command == nil {
		cmd := Command{Fingerprint: func() ([]string, error) {
			fields, err := m.opts.Fingerprint(r, body)
			if err != nil {
				return nil, err
			}
			return fingerprint.Hashes(m.opts.Operation, fields)
		}}
		if m.opts.RawHash != nil {
			cmd.RawHash = m.opts.RawHash(r, body)
		}
		return cmd, nil
	}
	cmd, err := m.opts.Hooks.Command(r, body)
	if err != nil {
		return Command{}, err
	}
	if len(cmd.Hashes) == 0 && cmd.Fingerprint == nil {
		if cmd.Hashes, err = fingerprint.Hashes(m.opts.Operation, cmd.Fields); err != nil {
			return Command{}, err
		}
	}
	return cmd, nil
}

// writeStored writes a stored answer, or returns the error that answers
// one stored without its body (NotStoredSchema).
func writeStored(w http.ResponseWriter, resp idem.Response, replayed bool) error {
	if resp.SchemaVersion == NotStoredSchema {
		return idem.Errorf(idem.ECodeResponseNotStored, "The first answer to this idempotency key was passed on once without being stored "+
			"(a stream, or larger than can be stored), so it cannot be replayed; the request is not executed again.")
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	status := resp.Status
	if status < 100 || status > 999 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
	return nil
}

// result classifies the handler's answer.
func (m *middleware) result(rec *recorder) engine.Result {
	if rec.overflow {
		class := rec.class
		if class == "" {
			class = DefaultClass(rec.status)
		}
		if class != idem.StatusFailedRetryable {
			class = idem.StatusUnknown
		}
		return engine.Result{Status: class, ErrorCode: idem.ECodeResponseTooLarge}
	}
	res := httpanswer.Answer{Status: rec.status, Header: rec.header, Body: rec.buf.Bytes(), Class: rec.class, NotStored: rec.passing}.
		Result(m.opts.ReplayHeaders)
	// A handler that recorded its answer itself (Stored) has written the
	// record: the engine writes nothing of res.
	res.Stored = rec.stored
	return res
}

// DefaultClass is how an answer of status is stored when the handler does
// not Classify it: 1xx-3xx COMPLETED; 408, 409, 425, 429 and 5xx
// FAILED_RETRYABLE; other 4xx FAILED_REPLAYABLE. The sidecar classifies an
// upstream's answer by it too.
func DefaultClass(status int) idem.Status { return httpanswer.DefaultClass(status) }

// CheckContentLength returns 413 REQUEST_BODY_TOO_LARGE (an *idem.Error)
// when r declares a body (Content-Length) larger than limit, and nil
// otherwise. A handler that checks it before it reads the body refuses a
// client that sent Expect: 100-continue without inviting the body:
// net/http's server sends 100 Continue when a handler first reads it, and
// a client that got it sends the whole body before it reads the answer. A
// body of undeclared length (chunked) can only be cut as it is read.
func CheckContentLength(r *http.Request, limit int64) error {
	if r.ContentLength > limit {
		return errBodyTooLarge(limit)
	}
	return nil
}

func errBodyTooLarge(limit int64) error {
	return idem.Errorf(idem.ECodeBodyTooLarge, "The body is larger than %d bytes.", limit)
}

// readBody reads the whole body, bounded by limit.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var (
		mbe *http.MaxBytesError
		ie  *idem.Error
	)
	switch {
	case errors.As(err, &mbe):
		return nil, errBodyTooLarge(limit)
	case errors.As(err, &ie):
		// The server's body reader said why (a read deadline, say).
		return nil, ie
	case err != nil:
		return nil, &idem.Error{Code: idem.ECodeRequestMalformed, Message: "The body could not be read.", Err: err}
	}
	return body, nil
}

// DefaultFingerprint returns the default FingerprintFunc (see
// Options.Fingerprint) with the given semantic headers (none: Api-Version).
func DefaultFingerprint(semanticHeaders ...string) FingerprintFunc {
	if len(semanticHeaders) == 0 {
		semanticHeaders = []string{"Api-Version"}
	}
	return func(r *http.Request, body []byte) (map[string]any, error) {
		if len(bytes.TrimSpace(body)) > 0 {
			if ct := r.Header.Get("Content-Type"); ct != "" {
				if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
					return nil, idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json.")
				}
			}
		}
		route := r.Pattern
		if route == "" {
			route = r.Method + " " + r.URL.Path
		}
		params := map[string]any{}
		for _, name := range wildcards(r.Pattern) {
			params[name] = r.PathValue(name)
		}
		headers := map[string]any{}
		for _, name := range semanticHeaders {
			if v := r.Header.Values(name); len(v) > 0 {
				headers[http.CanonicalHeaderKey(name)] = strings.Join(v, ",")
			}
		}
		var doc any
		if len(bytes.TrimSpace(body)) > 0 {
			obj, err := fingerprint.ParseObject(body)
			if err != nil {
				return nil, err
			}
			doc = obj
		}
		return map[string]any{"method": r.Method, "route": route, "pathParams": params, "headers": headers, "body": doc}, nil
	}
}

// DefaultRawHash returns the default Options.RawHash of operation, for the
// default Fingerprint with the given semantic headers (none: Api-Version):
// fingerprint.RawHash over the body and everything else that Fingerprint
// reads: the method, the route pattern, the path (which holds the
// pattern's path values), the Content-Type (which decides whether the body
// is accepted) and the semantic headers present.
func DefaultRawHash(operation string, semanticHeaders ...string) func(r *http.Request, body []byte) string {
	if len(semanticHeaders) == 0 {
		semanticHeaders = []string{"Api-Version"}
	}
	names := make([]string, len(semanticHeaders))
	for i, h := range semanticHeaders {
		names[i] = http.CanonicalHeaderKey(h)
	}
	return func(r *http.Request, body []byte) string {
		var buf [16]string
		in := append(buf[:0], "method", r.Method, "route", r.Pattern, "path", r.URL.EscapedPath())
		if ct, ok := r.Header["Content-Type"]; ok {
			in = append(in, "Content-Type", strings.Join(ct, ","))
		}
		for _, name := range names {
			if v := r.Header.Values(name); len(v) > 0 {
				in = append(in, name, strings.Join(v, ","))
			}
		}
		return fingerprint.RawHash(operation, body, in...)
	}
}

// wildcards returns the names of a ServeMux pattern's wildcards.
func wildcards(pattern string) []string {
	var out []string
	for {
		i := strings.IndexByte(pattern, '{')
		if i < 0 {
			return out
		}
		j := strings.IndexByte(pattern[i:], '}')
		if j < 0 {
			return out
		}
		name := strings.TrimSuffix(pattern[i+1:i+j], "...")
		if name != "$" && name != "" {
			out = append(out, name)
		}
		pattern = pattern[i+j+1:]
	}
}

// clientError turns a fingerprinting error into the *idem.Error a client
// sees; the body is never quoted.
func clientError(err error) error {
	var ie *idem.Error
	switch {
	case errors.As(err, &ie):
		return err
	case errors.Is(err, fingerprint.ErrInexactNumber):
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: "A number cannot be represented exactly; send it as a string.", Err: err}
	case errors.Is(err, fingerprint.ErrReservedName), errors.Is(err, fingerprint.ErrInvalidUTF8), errors.Is(err, fingerprint.ErrUnsupportedType):
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: "The request cannot be fingerprinted.", Err: err}
	}
	return strictjson.ClientError(err)
}

// wait is how long a request waits for a key in progress: Prefer: wait=N
// (PreferWait), or else Options.Wait, capped at MaxWait.
func (m *middleware) wait(h http.Header) time.Duration {
	if d, ok := PreferWait(h, m.opts.MaxWait); ok {
		return d
	}
	return min(m.opts.Wait, m.opts.MaxWait)
}

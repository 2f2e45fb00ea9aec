package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/httpanswer"
)

// Headers the upstream receives.
const (
	HeaderTenant       = "Idem-Tenant"
	HeaderFencingToken = "Idem-Fencing-Token"
)

// DerivedKey is the Idempotency-Key the upstream receives: the lowercase hex
// SHA-256 of "idem-sidecar-v1" followed by the tenant, the operation and the
// client's key, each prefixed by its length as 8 big-endian bytes, and the
// record's generation as 8 big-endian bytes. The length prefixes make the
// encoding injective, so two tenants (or operations, keys, generations) never
// share a derived key; it depends on nothing regional, so every region
// derives the same one. A key reused after its replay window (a new
// generation) is a new operation and gets a new derived key.
func DerivedKey(tenant, operation, key string, generation int) string {
	h := sha256.New()
	h.Write([]byte("idem-sidecar-v1"))
	var n [8]byte
	for _, s := range []string{tenant, operation, key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	binary.BigEndian.PutUint64(n[:], uint64(generation))
	h.Write(n[:])
	return hex.EncodeToString(h.Sum(nil))
}

// Options configure a Proxy.
type Options struct {
	// Routes are the routes to serve (required).
	Routes []Route
	// Tenant returns the tenant of an authenticated request. Default: the
	// tenant put in the request's context by WithTenant (a request without
	// one answers 401).
	Tenant func(r *http.Request) (string, error)
	// Client calls the upstream. Default: a client that keeps connections
	// alive (DefaultTransport's pool), never follows redirects and asks for
	// unencoded answers. A custom client must do the same; whatever the
	// client, the proxy never lets its transport send a request twice (see
	// the package documentation).
	Client *http.Client
	// MaxBodyBytes bounds a request's body (413 past it; at once, before
	// anything is read, when its Content-Length says so). Default
	// idemhttp.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxResponseBody bounds the upstream answer stored for replay, for
	// routes without a MaxResponse of their own. Default
	// idemhttp.DefaultMaxResponseBody.
	MaxResponseBody int
	// MaxWait caps the wait a client states with Prefer: wait=N
	// (idemhttp.PreferWait) and a route's Wait. Default
	// engine.DefaultMaxWait.
	MaxWait time.Duration
	// Errors is the table the proxy's own error answers are written by
	// (problem+json, or a route's ErrorEnvelope; the upstream's answers are
	// passed on as they are).
	// Default idemhttp.DefaultErrors().
	Errors *idemhttp.Errors
	// Logger receives upstream failures. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, counts the upstream calls and the requests
	// (idemprom.New makes them idem_sidecar_upstream_calls_total and
	// idemhttp_requests_total).
	Metrics Metrics
}

// Metrics counts what a Proxy does: the requests, as idemhttp.Metrics
// does, and the calls of its upstreams.
type Metrics interface {
	idemhttp.Metrics
	// UpstreamCalls is called once per route with its operation and
	// returns what counts that operation's upstream calls by kind (one of
	// CallKinds()) and result (one of CallResults()), concurrently; result
	// "unknown" is an outcome an operator may have to settle. It may
	// create every series then.
	UpstreamCalls(operation string) func(call, result string)
}

// DefaultReplayHeaders are the upstream answer's headers stored and
// replayed for every route (Route.ReplayHeaders adds to them): the
// middleware's default Options.ReplayHeaders, Content-Type,
// Content-Encoding and Location.
var DefaultReplayHeaders = httpanswer.DefaultReplayHeaders()

// Call kinds and results Metrics counts upstream calls by.
var (
	callKinds   = []string{"execute", "lookup", "resend"}
	callResults = []string{"completed", "failed_replayable", "failed_retryable", "not_sent", "unknown"}
)

// CallKinds returns the kinds of upstream call Metrics counts: execute
// (the request itself), lookup (Route.Lookup, asking what became of an
// attempt) and resend (an idempotent upstream sent the attempt again).
func CallKinds() []string { return slices.Clone(callKinds) }

// CallResults returns the results Metrics counts upstream calls by.
func CallResults() []string { return slices.Clone(callResults) }

// Proxy serves the routes of a sidecar. Create it with New.
type Proxy struct {
	opts   Options
	routes []*route
	// calls counts a route's upstream calls, by operation; nil without
	// Options.Metrics.
	calls map[string]func(call, result string)
}

type route struct {
	Route
	handler http.Handler
	// replayHeaders are DefaultReplayHeaders and Route.ReplayHeaders.
	replayHeaders []string
	// maxResponse is Route.MaxResponse or Options.MaxResponseBody.
	maxResponse int
	// webhook verifies the deliveries of a webhook route; nil for others.
	webhook *verifier
	// errors is Options.Errors, with OUTCOME_UNKNOWN as Route.UnknownStatus
	// says, in the route's ErrorEnvelope.
	errors *idemhttp.Errors
}

type tenantKey struct{}

// WithTenant returns ctx carrying the authenticated tenant, for the default
// Options.Tenant.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

func tenantFromContext(r *http.Request) (string, error) {
	if t, _ := r.Context().Value(tenantKey{}).(string); t != "" {
		return t, nil
	}
	return "", errors.New("sidecar: no tenant in the request's context")
}

// New registers every route's operation with e and returns the Proxy.
func New(e *engine.Engine, opts Options) (*Proxy, error) {
	if len(opts.Routes) == 0 {
		return nil, errors.New("sidecar: no routes")
	}
	if opts.Tenant == nil {
		opts.Tenant = tenantFromContext
	}
	if opts.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// The answer is stored as received: ask for it unencoded.
		tr.DisableCompression = true
		tr.MaxIdleConnsPerHost = 64
		opts.Client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = idemhttp.DefaultMaxBodyBytes
	}
	if opts.MaxResponseBody <= 0 {
		opts.MaxResponseBody = idemhttp.DefaultMaxResponseBody
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Errors == nil {
		opts.Errors = idemhttp.DefaultErrors()
	}
	p := &Proxy{opts: opts}
	var requests idemhttp.Metrics // an untyped nil without opts.Metrics
	if opts.Metrics != nil {
		p.calls = make(map[string]func(call, result string), len(opts.Routes))
		requests = opts.Metrics
	}
	for _, rt := range opts.Routes {
		rt = rt.served()
		if opts.Metrics != nil {
			p.calls[rt.Operation] = opts.Metrics.UpstreamCalls(rt.Operation)
		}
		r := &route{Route: rt, replayHeaders: append(slices.Clone(DefaultReplayHeaders), rt.ReplayHeaders...), maxResponse: rt.MaxResponse}
		r.errors = opts.Errors
		if rt.UnknownStatus == http.StatusServiceUnavailable {
			r.errors = opts.Errors.WithStatus(idem.ECodeOutcomeUnknown, idemhttp.ErrorClass{
				Status: http.StatusServiceUnavailable, RetryAfter: 1, Title: opts.Errors.Class(idem.ECodeOutcomeUnknown).Title})
		}
		env, err := loadEnvelope(rt)
		if err != nil {
			return nil, fmt.Errorf("sidecar: route %s %s: %w", rt.Method, rt.Prefix, err)
		}
		if env != nil {
			r.errors = r.errors.WithEnvelope(env)
		}
		if r.maxResponse <= 0 {
			r.maxResponse = opts.MaxResponseBody
		}
		tenant := opts.Tenant
		if rt.Webhook != "" {
			if r.webhook, err = newVerifier(rt, opts.Logger, opts.Metrics); err != nil {
				return nil, fmt.Errorf("sidecar: route %s %s: %w", rt.Method, rt.Prefix, err)
			}
			// The signature, verified first, authenticates the sender.
			tenant = func(*http.Request) (string, error) { return rt.WebhookTenant, nil }
		}
		var recover engine.ExecuteFunc
		if rt.Lookup != "" || rt.IdempotentUpstream {
			recover = func(ctx context.Context, a *engine.Attempt) (engine.Result, error) { return p.recover(ctx, r, a) }
		}
		mw, err := idemhttp.Middleware(e, idemhttp.Options{
			Operation:       rt.Operation,
			Tenant:          tenant,
			Fingerprint:     fingerprintOf(rt),
			RawHash:         rawHashOf(rt),
			ReplayHeaders:   r.replayHeaders,
			LockFor:         rt.Timeout + lockMargin,
			Window:          rt.window(),
			MaxWait:         opts.MaxWait,
			Wait:            rt.Wait,
			MaxBodyBytes:    opts.MaxBodyBytes,
			MaxResponseBody: max(r.maxResponse, ownAnswerRoom),
			Errors:          r.errors,
			Recover:         recover,
			Logger:          opts.Logger,
			Metrics:         requests,
		})
		if err != nil {
			return nil, fmt.Errorf("sidecar: route %s %s: %w", rt.Method, rt.Prefix, err)
		}
		r.handler = p.insideRoute(r, p.checkWebhook(r, p.keepRequest(r, mw(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { p.execute(w, req, r) })))))
		p.routes = append(p.routes, r)
	}
	return p, nil
}

// ownAnswerRoom is the least the middleware may buffer: the proxy passes
// on an upstream answer larger than the route's maxResponse itself, and its
// own error answers (never stored) fit under any maxResponse.
const ownAnswerRoom = 4 << 10

// lockMargin is how much longer than an upstream call an owner holds its
// record, so that it records the call's end before a retry may take over.
const lockMargin = 5 * time.Second

// Routes returns the proxy's routes.
func (p *Proxy) Routes() []Route {
	out := make([]Route, len(p.routes))
	for i, r := range p.routes {
		out[i] = r.Route
	}
	return out
}

// Handler returns the handler of the route of operation, or nil.
func (p *Proxy) Handler(operation string) http.Handler {
	for _, r := range p.routes {
		if r.Operation == operation {
			return r.handler
		}
	}
	return nil
}

// Errors returns the table the route of operation answers its own errors
// by (Options.Errors, with the route's UnknownStatus and ErrorEnvelope), or
// nil: for a server that answers errors of the route's requests before
// they reach the proxy (authentication, routing).
func (p *Proxy) Errors(operation string) *idemhttp.Errors {
	for _, r := range p.routes {
		if r.Operation == operation {
			return r.errors
		}
	}
	return nil
}

// ServeHTTP serves the route a request matches, or 404.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, rt := range p.routes {
		if rt.Matches(r.Method, r.URL.Path) {
			rt.handler.ServeHTTP(w, r)
			return
		}
	}
	p.opts.Errors.Write(w, r, p.opts.Logger, idem.Errorf(idem.ECodeNotFound, "No such endpoint."))
}

// insideRoute answers 400 REQUEST_PATH_INVALID, before anything is read,
// stored or sent on, to a request whose path an upstream could resolve
// outside the route (CheckPath).
func (p *Proxy) insideRoute(rt *route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := CheckPath(r.URL.EscapedPath()); err != nil {
			rt.errors.Write(w, r, p.opts.Logger, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// original is the client's request as received, kept for a re-send.
type original struct {
	method string
	url    *url.URL
	header http.Header
	body   []byte
	// cut: the upstream's answer broke off while it was being passed
	// through; the client's connection is aborted so that it cannot take
	// what it got for the whole answer.
	cut bool
}

type originalKey struct{}

// keepRequest reads the body (bounded; the middleware refuses a larger one)
// and keeps the request in the context, where Recover finds it when a
// client's retry triggers recovery. For a route whose key is a body field,
// it puts the key where the middleware reads it. A body whose
// Content-Length is over the limit is not read: the middleware refuses it
// before reading, so a client that sent Expect: 100-continue gets the 413
// and no 100 Continue.
func (p *Proxy) keepRequest(rt *route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if idemhttp.CheckContentLength(r, p.opts.MaxBodyBytes) != nil {
			next.ServeHTTP(w, r)
			return
		}
		var body []byte
		if r.Body != nil {
			b, err := io.ReadAll(io.LimitReader(r.Body, p.opts.MaxBodyBytes+1))
			body = b
			var rest io.Reader = bytes.NewReader(b)
			if err != nil {
				rest = io.MultiReader(rest, errReader{err})
			}
			r.Body = io.NopCloser(rest)
		}
		if int64(len(body)) <= p.opts.MaxBodyBytes {
			if rt.KeyField != "" {
				key, err := keyFromBody(rt.Route, r.Header.Get("Content-Type"), body)
				if err != nil {
					rt.errors.Write(w, r, p.opts.Logger, err)
					return
				}
				r.Header.Set(idemhttp.HeaderKey, quoteKey(key))
			}
			o := &original{method: r.Method, url: r.URL, header: r.Header.Clone(), body: body}
			r = r.WithContext(context.WithValue(r.Context(), originalKey{}, o))
			next.ServeHTTP(w, r)
			if o.cut {
				// As httputil.ReverseProxy does: net/http closes the
				// connection without ending the body.
				panic(http.ErrAbortHandler)
			}
			return
		}
		next.ServeHTTP(w, r)
	})
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// upstreamAnswer is how one upstream call ended.
type upstreamAnswer struct {
	status int
	header http.Header
	body   []byte
	// notStored: the answer was a stream or larger than the route's
	// maxResponse; it was passed on (or dropped) and body is nil.
	notStored bool
	// cut is the error that broke off a passed-on answer.
	cut error
	// result is the metric's result.
	result string
	// class overrides idemhttp.DefaultClass ("" keeps it).
	class idem.Status
}

// execute proxies a fresh request (the middleware's handler).
func (p *Proxy) execute(w http.ResponseWriter, r *http.Request, rt *route) {
	a := idemhttp.AttemptFrom(r.Context())
	o, _ := r.Context().Value(originalKey{}).(*original)
	if a == nil || o == nil {
		idemhttp.Classify(w, idem.StatusFailedRetryable)
		rt.errors.Write(w, r, p.opts.Logger, idem.Errorf(idem.ECodeInternal, "Internal error."))
		return
	}
	// The body the middleware read is the one kept.
	ans := p.call(r.Context(), rt, "execute", o, a, func(ans upstreamAnswer, body io.Reader) error {
		idemhttp.PassThrough(w)
		for k, v := range ans.header {
			w.Header()[k] = v
		}
		w.WriteHeader(ans.status)
		return passOn(w, body)
	})
	if ans.class != "" {
		idemhttp.Classify(w, ans.class)
	}
	if ans.notStored {
		o.cut = ans.cut != nil
		return
	}
	for k, v := range ans.header {
		w.Header()[k] = v
	}
	w.WriteHeader(ans.status)
	_, _ = w.Write(ans.body)
}

// recover settles a record left after the request may have reached the
// upstream: by the route's lookup, or by re-sending the client's request
// to an upstream idempotent on the derived key.
func (p *Proxy) recover(ctx context.Context, rt *route, a *engine.Attempt) (engine.Result, error) {
	if rt.Lookup != "" {
		res, settled := p.lookup(ctx, rt, a)
		if settled {
			return res, nil
		}
	}
	o, _ := ctx.Value(originalKey{}).(*original)
	if rt.IdempotentUpstream && o != nil {
		// No client waits for this answer as it comes: one too large
		// to store is settled without its body.
		return p.result(rt, p.call(ctx, rt, "resend", o, a, nil)), nil
	}
	// The engine gives the record the operation's code for an unknown
	// outcome, as for any answer classified UNKNOWN_REQUIRES_RECOVERY.
	return engine.Result{Status: idem.StatusUnknown}, nil
}

// result records ans as the middleware records an answer the proxy
// writes; one not stored, or too large to store, is settled without its
// body (idemhttp.NotStoredSchema).
func (p *Proxy) result(rt *route, ans upstreamAnswer) engine.Result {
	return httpanswer.Answer{Status: ans.status, Header: ans.header, Body: ans.body, Class: ans.class,
		NotStored: ans.notStored || len(ans.body) > rt.maxResponse}.Result(rt.replayHeaders)
}

// lookup asks the route's lookup URL about the derived key: 2xx settles the
// record COMPLETED with that answer, 404 says nothing happened (the record
// is released for the next retry), anything else leaves it unknown.
func (p *Proxy) lookup(ctx context.Context, rt *route, a *engine.Attempt) (engine.Result, bool) {
	rec := a.Record
	derived := DerivedKey(rec.Tenant, rec.Operation, rec.Key, rec.Generation)
	ctx, cancel := context.WithTimeout(ctx, rt.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.ReplaceAll(rt.Lookup, "{derivedKey}", derived), nil)
	if err != nil {
		p.count(rt, "lookup", "unknown")
		return engine.Result{}, false
	}
	req.Header.Set(idemhttp.HeaderKey, derived)
	req.Header.Set(HeaderTenant, rec.Tenant)
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		p.count(rt, "lookup", "not_sent")
		p.opts.Logger.WarnContext(ctx, "sidecar lookup failed", "operation", rt.Operation, "err", err)
		return engine.Result{}, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(rt.maxResponse)+1))
	switch {
	case err != nil:
		p.count(rt, "lookup", "unknown")
		return engine.Result{}, false
	case resp.StatusCode == http.StatusNotFound:
		p.count(rt, "lookup", "failed_retryable")
		return engine.Result{Status: idem.StatusFailedRetryable, ErrorCode: idem.ECodeUnavailable}, true
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		// It happened; an answer too large to store settles it without
		// its body.
		p.count(rt, "lookup", "completed")
		return p.result(rt, upstreamAnswer{status: resp.StatusCode, header: resp.Header, body: body, class: idem.StatusCompleted}), true
	}
	p.count(rt, "lookup", "unknown")
	return engine.Result{}, false
}

func (p *Proxy) count(rt *route, call, result string) {
	if count := p.calls[rt.Operation]; count != nil {
		count(call, result)
	}
}

// hopByHop are the headers of one connection (RFC 9110 7.6.1).
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// stripHeaders removes the hop-by-hop headers of h, including those its
// Connection header names.
func stripHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// call sends o to the upstream under a. An answer that is a stream
// (text/event-stream) or larger than the route's maxResponse is not read
// into memory: pass, when set, passes it on (its body is what was read of
// it and the rest as it arrives) and returns the read error that broke it
// off; without pass it is dropped. Either way it is notStored.
func (p *Proxy) call(ctx context.Context, rt *route, kind string, o *original, a *engine.Attempt,
	pass func(ans upstreamAnswer, body io.Reader) error) upstreamAnswer {
	rec := a.Record
	derived := DerivedKey(rec.Tenant, rec.Operation, rec.Key, rec.Generation)
	u := *rt.Upstream
	u.Path = strings.TrimSuffix(rt.Upstream.Path, "/") + o.url.Path
	u.RawPath = strings.TrimSuffix(rt.Upstream.EscapedPath(), "/") + o.url.EscapedPath()
	u.RawQuery = o.url.RawQuery
	var written atomic.Bool
	trace := &httptrace.ClientTrace{
		// Once the headers are out, the upstream may act on the request.
		WroteHeaders: func() { written.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) { written.Store(true) },
	}
	cctx, cancel := context.WithTimeout(httptrace.WithClientTrace(ctx, trace), rt.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, o.method, u.String(), nil)
	if err != nil {
		p.count(rt, kind, "not_sent")
		p.opts.Logger.ErrorContext(ctx, "sidecar request not built", "operation", rt.Operation, "err", err)
		return p.errorAnswer(rt, idem.StatusFailedRetryable, "not_sent", idem.ECodeUnavailable,
			"The upstream could not be called; retry with the same key.")
	}
	sendOnce(req, o.body)
	req.Header = o.header.Clone()
	stripHeaders(req.Header)
	if !rt.PassAuthorization {
		req.Header.Del("Authorization")
	}
	req.Header.Del("Cookie")
	// The client's encoding preference would reach the stored bytes.
	req.Header.Del("Accept-Encoding")
	for name := range req.Header {
		if strings.HasPrefix(name, "Idem-") {
			req.Header.Del(name)
		}
	}
	req.Header.Set(idemhttp.HeaderKey, derived)
	req.Header.Set(HeaderTenant, rec.Tenant)
	req.Header.Set(HeaderFencingToken, strconv.FormatInt(a.Lease.Token, 10))
	if err := a.Check(); err != nil {
		p.count(rt, kind, "not_sent")
		return p.errorAnswer(rt, idem.StatusFailedRetryable, "not_sent", idem.ECodeInProgress,
			"A request with this idempotency key is still in progress; retry later.")
	}
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		if !written.Load() {
			p.count(rt, kind, "not_sent")
			p.opts.Logger.WarnContext(ctx, "sidecar upstream unreachable", "operation", rt.Operation, "err", err)
			return p.errorAnswer(rt, idem.StatusFailedRetryable, "not_sent", idem.ECodeUnavailable,
				"The upstream could not be reached; retry with the same key.")
		}
		return p.lost(ctx, rt, kind, err)
	}
	defer resp.Body.Close()
	streamed := isEventStream(resp.Header) || resp.ContentLength > int64(rt.maxResponse)
	var body []byte
	if !streamed {
		// Without a Content-Length, the length shows once it is read: up
		// to maxResponse, then it is passed on like a stream.
		body, err = io.ReadAll(io.LimitReader(resp.Body, int64(rt.maxResponse)+1))
		if err != nil {
			return p.lost(ctx, rt, kind, err)
		}
		streamed = len(body) > rt.maxResponse
	}
	header := resp.Header.Clone()
	stripHeaders(header)
	header.Del("Content-Length")
	// The contract's headers are the sidecar's to set.
	header.Del(idemhttp.HeaderReplayed)
	header.Del(idemhttp.HeaderWindow)
	ans := upstreamAnswer{status: resp.StatusCode, header: header, body: body}
	if streamed {
		ans.notStored = true
		if pass != nil {
			if resp.ContentLength >= 0 {
				header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
			}
			ans.cut = pass(ans, io.MultiReader(bytes.NewReader(body), resp.Body))
			header.Del("Content-Length")
		}
		ans.body = nil
		if ans.cut != nil {
			p.opts.Logger.WarnContext(ctx, "sidecar upstream answer broke off while passed on; the client's connection is aborted",
				"operation", rt.Operation, "err", ans.cut)
		}
	}
	switch idemhttp.DefaultClass(resp.StatusCode) {
	case idem.StatusCompleted:
		ans.result = "completed"
	case idem.StatusFailedReplayable:
		ans.result = "failed_replayable"
	default:
		ans.result = "failed_retryable"
	}
	p.count(rt, kind, ans.result)
	return ans
}

// isEventStream reports whether h is the header of a text/event-stream
// answer (server-sent events), which is passed on as it arrives.
func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// passOn copies body to w as it arrives, flushing after every read, and
// returns the read error that broke it off (nil at its end). A client that
// has gone does not stop it: the upstream's answer is read to its end (or
// the route's timeout), as a buffered one is.
func passOn(w http.ResponseWriter, body io.Reader) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	var werr error
	for {
		n, err := body.Read(buf)
		if n > 0 && werr == nil {
			if _, werr = w.Write(buf[:n]); werr == nil {
				_ = rc.Flush()
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
	}
}

// sendOnce gives req a body that net/http's transport cannot rewind, so
// that it never sends req a second time. The transport resends a request
// on a kept-alive connection that failed (the server closed it as the
// request went out) when it can rewind the body: when GetBody is set, or
// when there is no body at all and the request carries an
// Idempotency-Key, which it takes for a promise that a resend is harmless.
// The upstream may not deduplicate, so every request gets a body reader
// and no GetBody; an empty one is still sent as Content-Length: 0.
func sendOnce(req *http.Request, body []byte) {
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = nil
	req.ContentLength = int64(len(body))
}

// lost is an answer lost after the request may have reached the upstream.
func (p *Proxy) lost(ctx context.Context, rt *route, kind string, err error) upstreamAnswer {
	p.count(rt, kind, "unknown")
	p.opts.Logger.WarnContext(ctx, "sidecar upstream answer lost after the request was written; outcome unknown",
		"operation", rt.Operation, "err", err)
	return p.errorAnswer(rt, idem.StatusUnknown, "unknown", idem.ECodeOutcomeUnknown,
		"The outcome of the request with this idempotency key is not known yet; retry with the same key later.")
}

// errorAnswer is the proxy's own answer of code, recorded as class.
func (p *Proxy) errorAnswer(rt *route, class idem.Status, result, code, msg string) upstreamAnswer {
	status, h, b := rt.errors.Render(code, msg)
	return upstreamAnswer{status: status, header: h, body: b, result: result, class: class}
}

package sidecar

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// Route is one route made idempotent: requests of Method whose path is
// Prefix or lies under it run as Operation, proxied to Upstream.
type Route struct {
	// Method is POST, PUT, PATCH or DELETE.
	Method string
	// Prefix is a clean absolute path ("/transfers"); it matches itself and
	// every path under it ("/transfers/tr_1/reverse"), never "/transfersx".
	Prefix string
	// Operation is the scope's operation: 1 to 64 characters of a-z, 0-9,
	// '_', '.' and '-'.
	Operation string
	// Upstream is the service's base URL (http or https, no query); the
	// request's path is appended to its path.
	Upstream *url.URL
	// Lookup, when set, is a GET URL template containing {derivedKey}: it
	// settles an answer lost after the request was written (2xx: the
	// operation happened, and that answer is stored; 404: it did not, and
	// the next retry executes again; anything else: still unknown).
	Lookup string
	// IdempotentUpstream declares that the upstream itself deduplicates on
	// the Idempotency-Key it receives: an answer lost after the request was
	// written is settled by sending the request again with the same
	// derived key, when the client retries.
	IdempotentUpstream bool
	// SemanticHeaders are request headers that change a request's meaning, part of
	// its fingerprint (besides Api-Version).
	SemanticHeaders []string
	// Timeout bounds one upstream call and is the operation's lock timeout
	// (how long a crashed owner blocks a retry). Default DefaultTimeout.
	// The call runs to its end (or Timeout) even when the client hangs up
	// first, and its answer is stored for the client's retry.
	Timeout time.Duration
	// Wait is how long a request that finds its key in progress is held
	// until the first answer is stored, when the client does not send
	// Prefer: wait=N: SDKs retry a timed-out call at once and stop on a
	// 409, so with a Wait their retry gets the answer. Default 0: 409
	// IDEMPOTENCY_REQUEST_IN_PROGRESS at once.
	Wait time.Duration
	// Ignore are body fields left out of the fingerprint, such as request
	// timestamps or envelope ids that change on every retry: JSON pointers
	// (RFC 6901, "/meta/sent_at") into a JSON body, or names of a form
	// body's fields ("request_time").
	Ignore []string
	// KeyField, when set, is where the idempotency key is: a body field (a
	// JSON pointer to a string member, or a form field name) instead of
	// the Idempotency-Key header, as some APIs (Square's) put it in the
	// body. The field is left out of the fingerprint, like the header.
	KeyField string
	// ReplayHeaders are upstream answer headers stored and replayed besides
	// DefaultReplayHeaders. Set-Cookie is never stored unless named here.
	ReplayHeaders []string
	// UnknownStatus is the status a lost outcome answers with (code
	// OUTCOME_UNKNOWN, the record UNKNOWN_REQUIRES_RECOVERY): 202, the
	// default and the node's contract, or 503 with Retry-After, for clients
	// that take any status below 400 for success (stripe-go and most SDKs
	// would hand their caller an empty object): with 503 they retry with
	// the same key until the outcome is settled or their retries run out,
	// and report an error then. With ErrorEnvelope stripe, stripe-go reads
	// the 503 as a *stripe.Error and does not retry it: the caller gets
	// the error at once and retries with the same key itself.
	UnknownStatus int
	// PassAuthorization passes the client's Authorization to an upstream
	// that authenticates end users itself. The tenant still comes from the
	// node's credentials, and Authorization is never part of the
	// fingerprint. Default: not passed.
	PassAuthorization bool
	// MaxResponse bounds, in bytes, the upstream answer stored for replay:
	// 1 to MaxMaxResponse. A larger answer, and a text/event-stream one,
	// is passed to the client as it arrives and settled without its body,
	// so a retry answers 410 IDEMPOTENCY_RESPONSE_NOT_STORED (see the
	// package documentation). Default 0: the proxy's
	// Options.MaxResponseBody.
	MaxResponse int
	// ErrorEnvelope is the shape of the route's own error answers (not the
	// upstream's, which pass as they are): EnvelopeProblem (""), RFC 9457
	// problem+json, or EnvelopeStripe, Stripe's error object, for clients
	// that parse only their API's own errors. Status, Retry-After and the
	// errorCode are the same in every envelope (see idemhttp.Envelope).
	ErrorEnvelope string
	// ErrorEnvelopeFile, instead of ErrorEnvelope, is a JSON template of
	// the route's error answers (ParseEnvelopeTemplate), read by New.
	ErrorEnvelopeFile string
	// Window is the replay window: how long the key's record answers
	// retries, 1s to MaxWindow. Default 0: engine.DefaultWindow (24h), or
	// DefaultWebhookWindow for a webhook route.
	Window time.Duration
	// Webhook, when set, makes the route a receiver of events that their
	// sender signs and redelivers (see webhook.go): WebhookStandard
	// (Standard Webhooks: the key is the webhook-id header) or
	// WebhookStripe (the key is the event's "id"). The signature is
	// verified before anything is stored; the route needs
	// WebhookSecretFile and WebhookTenant, and takes POST only.
	Webhook string
	// WebhookSecretFile is a webhook route's file of signing secrets, one
	// a line (two during a rotation; blank lines and lines starting with
	// # are skipped), read by New.
	WebhookSecretFile string
	// WebhookTenant is the tenant a webhook route's events belong to:
	// senders carry no credentials of the node, their signature
	// authenticates them.
	WebhookTenant string
	// WebhookTolerance bounds how far a webhook's signed timestamp may be
	// from the node's clock, either way, 1s to MaxWebhookTolerance.
	// Default DefaultWebhookTolerance (5m).
	WebhookTolerance time.Duration
}

// MaxMaxResponse bounds Route.MaxResponse: 64 MiB, CockroachDB's largest
// write by default (kv.raft.command.max_size); stored answers are rows.
const MaxMaxResponse = 64 << 20

// DefaultTimeout is a Route's default Timeout.
const DefaultTimeout = 30 * time.Second

// ParseRoutes parses the --proxy-routes syntax: comma-separated routes
//
//	METHOD PATH_PREFIX=OPERATION@UPSTREAM_URL[;OPTION]...
//
// with the options lookup=URL (containing {derivedKey}), idempotent-upstream,
// header=NAME (repeatable), timeout=DURATION, wait=DURATION, ignore=FIELD
// (repeatable), key-field=FIELD, replay-header=NAME (repeatable),
// pass-authorization, max-response=BYTES, error-envelope=problem|stripe,
// error-envelope-file=PATH, window=DURATION, webhook=standard|stripe,
// webhook-secret-file=PATH, webhook-tenant=TENANT and
// webhook-tolerance=DURATION (see Route's fields). Spaces around routes are
// ignored; an empty string is no route. Two routes may not share an
// operation or a method and prefix.
func ParseRoutes(s string) ([]Route, error) {
	var routes []Route
	ops := map[string]bool{}
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		rt, err := parseRoute(part)
		if err != nil {
			return nil, fmt.Errorf("sidecar: route %d: %w", i+1, err)
		}
		if ops[rt.Operation] {
			return nil, fmt.Errorf("sidecar: route %d: operation %q is used twice", i+1, rt.Operation)
		}
		if seen[rt.Method+" "+rt.Prefix] {
			return nil, fmt.Errorf("sidecar: route %d: %s %s is routed twice", i+1, rt.Method, rt.Prefix)
		}
		ops[rt.Operation], seen[rt.Method+" "+rt.Prefix] = true, true
		routes = append(routes, rt)
	}
	return routes, nil
}

func parseRoute(s string) (Route, error) {
	var rt Route
	head, rest, ok := strings.Cut(s, "=")
	if !ok {
		return rt, errors.New("want METHOD PATH_PREFIX=OPERATION@UPSTREAM_URL")
	}
	method, prefix, ok := strings.Cut(strings.TrimSpace(head), " ")
	if !ok {
		return rt, errors.New("want a method, a space and a path prefix before '='")
	}
	rt.Method, rt.Prefix = method, strings.TrimSpace(prefix)
	switch rt.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return rt, fmt.Errorf("method %q: want POST, PUT, PATCH or DELETE", rt.Method)
	}
	if !validPrefix(rt.Prefix) {
		return rt, fmt.Errorf("path prefix %q: want a clean absolute path of letters, digits and -._~ segments", rt.Prefix)
	}
	fields := strings.Split(rest, ";")
	op, upstream, ok := strings.Cut(fields[0], "@")
	if !ok {
		return rt, errors.New("want OPERATION@UPSTREAM_URL after '='")
	}
	rt.Operation = strings.TrimSpace(op)
	if !ValidOperation(rt.Operation) {
		return rt, fmt.Errorf("operation %q: want 1 to %d characters of a-z, 0-9, '_', '.' and '-'", rt.Operation, idem.MaxOperationLen)
	}
	u, err := parseUpstream(strings.TrimSpace(upstream))
	if err == nil && (u.RawQuery != "" || u.ForceQuery) {
		err = errors.New("want no query")
	}
	if err != nil {
		return rt, fmt.Errorf("upstream: %w", err)
	}
	rt.Upstream = u
	for _, opt := range fields[1:] {
		name, val, hasVal := strings.Cut(strings.TrimSpace(opt), "=")
		switch {
		case name == "idempotent-upstream" && !hasVal:
			rt.IdempotentUpstream = true
		case name == "lookup" && hasVal:
			if rt.Lookup != "" {
				return rt, errors.New("lookup given twice")
			}
			if !strings.Contains(val, "{derivedKey}") {
				return rt, errors.New("lookup: the URL must contain {derivedKey}")
			}
			if _, err := parseUpstream(strings.ReplaceAll(val, "{derivedKey}", "k")); err != nil {
				return rt, fmt.Errorf("lookup: %w", err)
			}
			rt.Lookup = val
		case name == "header" && hasVal:
			if !validToken(val) {
				return rt, fmt.Errorf("header %q: want a header name", val)
			}
			rt.SemanticHeaders = append(rt.SemanticHeaders, http.CanonicalHeaderKey(val))
		case name == "timeout" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 || d > time.Hour {
				return rt, fmt.Errorf("timeout %q: want a duration from 1ns to 1h", val)
			}
			rt.Timeout = d
		case name == "wait" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d < 0 || d > engine.DefaultMaxWait {
				return rt, fmt.Errorf("wait %q: want a duration from 0 to %v", val, engine.DefaultMaxWait)
			}
			rt.Wait = d
		case name == "ignore" && hasVal:
			if !validField(val) {
				return rt, fmt.Errorf("ignore %q: want a JSON pointer (/a/b) or a form field name", val)
			}
			rt.Ignore = append(rt.Ignore, val)
		case name == "key-field" && hasVal:
			if rt.KeyField != "" {
				return rt, errors.New("key-field given twice")
			}
			if !validField(val) {
				return rt, fmt.Errorf("key-field %q: want a JSON pointer (/a/b) or a form field name", val)
			}
			rt.KeyField = val
		case name == "replay-header" && hasVal:
			if !validToken(val) {
				return rt, fmt.Errorf("replay-header %q: want a header name", val)
			}
			rt.ReplayHeaders = append(rt.ReplayHeaders, http.CanonicalHeaderKey(val))
		case name == "pass-authorization" && !hasVal:
			rt.PassAuthorization = true
		case name == "unknown-status" && hasVal:
			switch val {
			case "202":
				rt.UnknownStatus = http.StatusAccepted
			case "503":
				rt.UnknownStatus = http.StatusServiceUnavailable
			default:
				return rt, fmt.Errorf("unknown-status %q: want 202 or 503", val)
			}
		case name == "max-response" && hasVal:
			if rt.MaxResponse != 0 {
				return rt, errors.New("max-response given twice")
			}
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > MaxMaxResponse || strings.Trim(val, "0123456789") != "" {
				return rt, fmt.Errorf("max-response %q: want a number of bytes from 1 to %d", val, MaxMaxResponse)
			}
			rt.MaxResponse = n
		case name == "error-envelope" && hasVal:
			if rt.ErrorEnvelope != "" || rt.ErrorEnvelopeFile != "" {
				return rt, errors.New("error-envelope or error-envelope-file given twice")
			}
			if val != EnvelopeProblem && val != EnvelopeStripe {
				return rt, fmt.Errorf("error-envelope %q: want %s or %s", val, EnvelopeProblem, EnvelopeStripe)
			}
			rt.ErrorEnvelope = val
		case name == "error-envelope-file" && hasVal:
			if rt.ErrorEnvelope != "" || rt.ErrorEnvelopeFile != "" {
				return rt, errors.New("error-envelope or error-envelope-file given twice")
			}
			if !validField(val) {
				return rt, fmt.Errorf("error-envelope-file %q: want a path of visible ASCII characters without ',' or ';'", val)
			}
			rt.ErrorEnvelopeFile = val
		case name == "window" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d < time.Second || d > MaxWindow {
				return rt, fmt.Errorf("window %q: want a duration from 1s to %v", val, MaxWindow)
			}
			rt.Window = d
		case strings.HasPrefix(name, "webhook") && hasVal:
			if err := rt.webhookOption(name, val); err != nil {
				return rt, err
			}
		default:
			return rt, fmt.Errorf("option %q: want lookup=URL, idempotent-upstream, header=NAME, timeout=DURATION, wait=DURATION, ignore=FIELD, key-field=FIELD, replay-header=NAME, unknown-status=202|503, pass-authorization, max-response=BYTES, error-envelope=problem|stripe, error-envelope-file=PATH, window=DURATION, webhook=standard|stripe, webhook-secret-file=PATH, webhook-tenant=TENANT or webhook-tolerance=DURATION", name)
		}
	}
	if err := rt.checkWebhook(); err != nil {
		return rt, err
	}
	if rt.Timeout == 0 {
		rt.Timeout = DefaultTimeout
	}
	return rt, nil
}

// parseUpstream accepts an absolute http(s) URL with a host and neither
// user information, query nor fragment (a lookup template keeps its query).
func parseUpstream(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errors.New("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("want an http or https URL")
	case u.Host == "" || u.User != nil || u.Fragment != "" || u.Opaque != "":
		return nil, errors.New("want scheme://host[:port][/path] without user information or fragment")
	}
	return u, nil
}

// ValidOperation reports whether op is a well-formed operation name
// (idem.ValidOperation).
func ValidOperation(op string) bool { return idem.ValidOperation(op) }

// validPrefix: "/" followed by non-empty segments of [A-Za-z0-9-._~], none
// "." or "..", no trailing slash.
func validPrefix(p string) bool {
	if len(p) < 2 || len(p) > 256 || p[0] != '/' {
		return false
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
				return false
			}
		}
	}
	return true
}

// validField: a JSON pointer ("/" and segments) or a form field name, 1 to
// 256 visible ASCII characters without ',' or ';' (the route syntax's
// separators).
func validField(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == ',' || c == ';' {
			return false
		}
	}
	return true
}

// validToken: an HTTP header name (RFC 9110 token), at most 128 bytes.
func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// Patterns are the net/http.ServeMux patterns of rt: its prefix and every
// path under it.
func (rt Route) Patterns() []string {
	return []string{rt.Method + " " + rt.Prefix, rt.Method + " " + rt.Prefix + "/"}
}

// Matches reports whether a request of method and path is rt's.
func (rt Route) Matches(method, path string) bool {
	return method == rt.Method && (path == rt.Prefix || strings.HasPrefix(path, rt.Prefix+"/"))
}

// String is rt in the --proxy-routes syntax.
func (rt Route) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s=%s@%s", rt.Method, rt.Prefix, rt.Operation, rt.Upstream)
	if rt.Lookup != "" {
		b.WriteString(";lookup=" + rt.Lookup)
	}
	if rt.IdempotentUpstream {
		b.WriteString(";idempotent-upstream")
	}
	for _, h := range rt.SemanticHeaders {
		b.WriteString(";header=" + h)
	}
	if rt.Timeout != DefaultTimeout {
		b.WriteString(";timeout=" + rt.Timeout.String())
	}
	if rt.Wait != 0 {
		b.WriteString(";wait=" + rt.Wait.String())
	}
	for _, f := range rt.Ignore {
		b.WriteString(";ignore=" + f)
	}
	if rt.KeyField != "" {
		b.WriteString(";key-field=" + rt.KeyField)
	}
	for _, h := range rt.ReplayHeaders {
		b.WriteString(";replay-header=" + h)
	}
	if rt.PassAuthorization {
		b.WriteString(";pass-authorization")
	}
	if rt.UnknownStatus != 0 {
		b.WriteString(";unknown-status=" + strconv.Itoa(rt.UnknownStatus))
	}
	if rt.MaxResponse != 0 {
		b.WriteString(";max-response=" + strconv.Itoa(rt.MaxResponse))
	}
	if rt.Window != 0 {
		b.WriteString(";window=" + rt.Window.String())
	}
	b.WriteString(rt.webhookString())
	if rt.ErrorEnvelope != "" {
		b.WriteString(";error-envelope=" + rt.ErrorEnvelope)
	}
	if rt.ErrorEnvelopeFile != "" {
		b.WriteString(";error-envelope-file=" + rt.ErrorEnvelopeFile)
	}
	return b.String()
}

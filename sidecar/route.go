package sidecar

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemcoord/idem"
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
	// Headers are request headers that change a request's meaning, part of
	// its fingerprint (besides Api-Version).
	Headers []string
	// Timeout bounds one upstream call and is the operation's lock timeout
	// (how long a crashed owner blocks a retry). Default DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout is a Route's default Timeout.
const DefaultTimeout = 30 * time.Second

// ParseRoutes parses the --proxy-routes syntax: comma-separated routes
//
//	METHOD PATH_PREFIX=OPERATION@UPSTREAM_URL[;OPTION]...
//
// with the options lookup=URL (containing {derivedKey}), idempotent-upstream,
// header=NAME (repeatable) and timeout=DURATION. Spaces around routes are
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
			rt.Headers = append(rt.Headers, http.CanonicalHeaderKey(val))
		case name == "timeout" && hasVal:
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 || d > time.Hour {
				return rt, fmt.Errorf("timeout %q: want a duration from 1ns to 1h", val)
			}
			rt.Timeout = d
		default:
			return rt, fmt.Errorf("option %q: want lookup=URL, idempotent-upstream, header=NAME or timeout=DURATION", name)
		}
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
	for _, h := range rt.Headers {
		b.WriteString(";header=" + h)
	}
	if rt.Timeout != DefaultTimeout {
		b.WriteString(";timeout=" + rt.Timeout.String())
	}
	return b.String()
}

package sidecar

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/strictjson"
)

// Kinds of body, by media type.
const (
	bodyJSON   = "json"
	bodyForm   = "form"
	bodyOpaque = "bytes"
)

// bodyKind says how a body of Content-Type ct is fingerprinted: JSON
// (application/json, any +json type, or no Content-Type: strictly, as a
// JSON object), form (application/x-www-form-urlencoded: canonically) or
// anything else (as bytes, with the media type). mediaType is ct
// normalised (lowercase type and parameter names) for the opaque kind.
func bodyKind(ct string) (kind, mediaType string, err error) {
	if strings.TrimSpace(ct) == "" {
		return bodyJSON, "", nil
	}
	mt, params, perr := mime.ParseMediaType(ct)
	if perr != nil {
		return "", "", idem.Errorf(idem.ECodeUnsupportedMediaType, "The Content-Type header is malformed.")
	}
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return bodyJSON, "", nil
	case mt == "application/x-www-form-urlencoded":
		return bodyForm, "", nil
	}
	return bodyOpaque, mime.FormatMediaType(mt, params), nil
}

// fingerprintOf: the method, the path, the query (decoded, sorted), the
// semantic headers and the body (see bodyFields).
func fingerprintOf(rt Route) idemhttp.FingerprintFunc {
	base := idemhttp.DefaultFingerprint(append([]string{"Api-Version"}, rt.SemanticHeaders...)...)
	return func(r *http.Request, body []byte) (map[string]any, error) {
		kind, mediaType, err := bodyKind(r.Header.Get("Content-Type"))
		if err != nil {
			return nil, err
		}
		present := len(bytes.TrimSpace(body)) > 0
		raw := body
		if kind != bodyJSON {
			// The default reads JSON only: it hashes the rest of the
			// request, and the body is added below.
			raw = nil
		}
		fields, err := base(r, raw)
		if err != nil {
			return nil, err
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return nil, idem.Errorf(idem.ECodeRequestMalformed, "The query string is malformed.")
		}
		query := map[string]any{}
		for k, vs := range q {
			list := make([]any, len(vs))
			for i, v := range vs {
				list[i] = v
			}
			query[k] = list
		}
		// The mux pattern says which of a route's two patterns matched;
		// the path says it all.
		delete(fields, "route")
		delete(fields, "pathParams")
		fields["path"] = r.URL.EscapedPath()
		fields["query"] = query
		if !present {
			return fields, nil
		}
		// A JSON body is hashed as it always was ("body" alone); the other
		// kinds add "bodyType", so that no JSON body ever hashes like one
		// of them.
		switch kind {
		case bodyJSON:
			doc, _ := fields["body"].(map[string]any)
			for _, f := range rt.Ignore {
				fingerprint.Remove(doc, f)
			}
			if rt.KeyField != "" {
				fingerprint.Remove(doc, rt.KeyField)
			}
		case bodyForm:
			form, err := fingerprint.ParseForm(body, func(name string) bool { return rt.ignoresFormField(name) })
			if err != nil {
				return nil, err
			}
			fields["bodyType"], fields["body"] = bodyForm, form
		default:
			sum := sha256.Sum256(body)
			fields["bodyType"], fields["contentType"], fields["body"] = bodyOpaque, mediaType, hex.EncodeToString(sum[:])
		}
		return fields, nil
	}
}

// rawHashOf is the raw hash of a request of rt (idemhttp.Options.RawHash):
// fingerprint.RawHash over the body and everything else fingerprintOf
// reads: the method, the path, the query, the Content-Type, the semantic
// headers present, and the route's Ignore and KeyField, so that a route
// whose fingerprint leaves out other fields after a restart does not
// replay, as the same command, what the new fingerprint tells apart.
func rawHashOf(rt Route) func(r *http.Request, body []byte) string {
	headers := []string{"Api-Version"}
	for _, h := range rt.SemanticHeaders {
		headers = append(headers, http.CanonicalHeaderKey(h))
	}
	route := []string{"key-field", rt.KeyField}
	for _, f := range rt.Ignore {
		route = append(route, "ignore", f)
	}
	return func(r *http.Request, body []byte) string {
		var buf [24]string
		in := append(append(buf[:0], route...), "method", r.Method, "path", r.URL.EscapedPath(), "query", r.URL.RawQuery)
		if ct, ok := r.Header["Content-Type"]; ok {
			in = append(in, "Content-Type", strings.Join(ct, ","))
		}
		for _, name := range headers {
			if v := r.Header.Values(name); len(v) > 0 {
				in = append(in, name, strings.Join(v, ","))
			}
		}
		return fingerprint.RawHash(rt.Operation, body, in...)
	}
}

// ignoresFormField reports whether a form field is left out of the
// fingerprint: an Ignore entry or the KeyField names it (bare, or as a
// one-token JSON pointer).
func (rt Route) ignoresFormField(name string) bool {
	for _, f := range append(rt.Ignore, rt.KeyField) {
		if f != "" && (f == name || f == "/"+name) {
			return true
		}
	}
	return false
}

// errNoKeyField answers a request of a route whose key is a body field
// that the body lacks.
var errNoKeyField = idem.Errorf(idem.ECodeKeyMissing, "The request's idempotency key field is required.")

// keyFromBody reads the idempotency key from a body field (Route.KeyField):
// a string member of a JSON object, or a form field.
func keyFromBody(rt Route, ct string, body []byte) (string, error) {
	kind, _, err := bodyKind(ct)
	if err != nil {
		return "", err
	}
	switch kind {
	case bodyForm:
		name := strings.TrimPrefix(rt.KeyField, "/")
		if v, ok := fingerprint.FormValue(body, name); ok {
			return v, nil
		}
		if v, ok := fingerprint.FormValue(body, rt.KeyField); ok {
			return v, nil
		}
	case bodyJSON:
		doc, err := fingerprint.ParseObject(body)
		if err != nil {
			return "", strictjson.ClientError(err)
		}
		if v, ok := fingerprint.Lookup(doc, rt.KeyField); ok {
			if s, ok := v.(string); ok {
				return s, nil
			}
			return "", idem.Errorf(idem.ECodeKeyInvalid, "The request's idempotency key field must be a string.")
		}
	}
	return "", errNoKeyField
}

// quoteKey writes key as an RFC 8941 sf-string, which idemhttp.ParseKey
// reads back exactly.
func quoteKey(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

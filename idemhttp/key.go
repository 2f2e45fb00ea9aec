package idemhttp

import (
	"net/http"
	"strings"

	"github.com/idemcoord/idem"
)

// KeyFromHeader reads the idempotency key of a request: exactly one
// Idempotency-Key field, either bare (abc-123) or in the IETF draft's
// Structured Field form, an RFC 8941 sf-string ("abc-123", with \" and \\
// escapes), which is the same key. It answers *idem.Error
// IDEMPOTENCY_KEY_MISSING without the field and IDEMPOTENCY_KEY_INVALID for
// several fields, a malformed sf-string or a key that is not 1 to 255
// visible ASCII characters. Every surface of the service reads the header
// here.
func KeyFromHeader(h http.Header) (string, error) {
	vals, present := h[HeaderKey]
	if !present {
		return "", idem.Errorf(idem.ECodeKeyMissing, "The Idempotency-Key header is required.")
	}
	if len(vals) != 1 {
		return "", errKeyInvalid()
	}
	key, ok := ParseKey(vals[0])
	if !ok {
		return "", errKeyInvalid()
	}
	return key, nil
}

func errKeyInvalid() error {
	return idem.Errorf(idem.ECodeKeyInvalid, "The Idempotency-Key header must be one key of 1 to 255 visible ASCII characters, bare or as a quoted string.")
}

// ParseKey reads one Idempotency-Key field value: a bare key, or an RFC 8941
// sf-string holding it. ok is false for a malformed string (an unescaped or
// unknown escape, a missing closing quote, anything after it, parameters)
// and for a key that idem.ValidKey refuses.
func ParseKey(v string) (key string, ok bool) {
	v = strings.Trim(v, " \t")
	if !strings.HasPrefix(v, `"`) {
		return v, idem.ValidKey(v)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", false
			}
			key = b.String()
			return key, idem.ValidKey(key)
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}

// Package fingerprint computes request hashes: the stored memory of what the
// first command of a scoped key meant.
//
// The hash is a contract. A command is parsed and normalised by its operation
// (amounts to minor units, enum case, defaults filled in), transport metadata
// is dropped, and what remains (operation name, path parameters, semantic
// headers such as Api-Version, and the normalised fields) is serialised in a
// canonical JSON form and hashed with SHA-256. The result carries its version
// as a prefix ("v2:<hex>"); changing how a hash is computed is a new version,
// never an edit of an old one. A record stores the version its hash was
// computed under, and a command is compared with a record under every
// supported version ([Hashes]), so records written before a version change
// still replay and still conflict.
//
// # Versions
//
// Version 2 (current) is RFC 8785 (JCS) with exact numbers. The document is
// the fields plus a member "operation" holding the operation name; a field
// named "operation" is an error ([ErrReservedName]), never overwritten.
// Strings must be valid UTF-8 ([ErrInvalidUTF8]); they are never repaired.
// Numbers are written as follows:
//
//   - Go integers (int, int64, uint64, ...) are written with all their
//     digits, whatever their size. For integers of magnitude up to 2^53 this
//     is exactly what RFC 8785 writes; beyond it, RFC 8785 would round the
//     value to a double, and version 2 does not.
//   - float64 values are written as RFC 8785 writes them (ECMAScript
//     shortest form); NaN and infinities are errors.
//   - [Number] values (JSON number literals from a client, see
//     [ParseObject]) are accepted only if the RFC 8785 form of the nearest
//     double denotes the same decimal value as the literal: 10.50, 1e3 and
//     0.1 are accepted (as 10.5, 1000 and 0.1), 9007199254740993 and
//     0.10000000000000001 are not ([ErrInexactNumber]), because a double
//     cannot tell them from a neighbour. Send such values as strings.
//
// So for every document without integers beyond 2^53, the version 2 form is
// byte for byte the RFC 8785 form, and a client can compute it with any JCS
// library.
//
// Version 1 marshalled the document with encoding/json (invalid UTF-8
// replaced by U+FFFD, a field named "operation" overwritten) and
// canonicalised it with github.com/gowebpki/jcs, which reads every number as
// a double: integers beyond 2^53 that round to the same double (for example
// the minor units of 999999999999999.99 and 999999999999999.98) hash alike.
// It is kept only to compare new commands with records written under it
// (their windows run out, and then it can be removed). For such a record a
// command whose v1 hash matches is a replay, so within its window a v1 record
// of an amount above 2^53 minor units still cannot tell that amount from one
// that rounds to the same double; all other v1 records compare exactly as
// before. Wherever version 1 was exact it hashed the same bytes as version 2,
// so "v2:X" and "v1:X" stand for the same command ([Equivalent]): a caller
// that sends only its own current-version hash still meets its v1 records.
package fingerprint

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Version is the current hash version: new records store it.
const Version = 2

// Versions returns the supported hash versions, current first.
func Versions() []int { return []int{2, 1} }

// Errors of version 2 canonicalisation, matched with errors.Is.
var (
	ErrReservedName    = errors.New("fingerprint: a field is named \"operation\"")
	ErrInvalidUTF8     = errors.New("fingerprint: string is not valid UTF-8")
	ErrInexactNumber   = errors.New("fingerprint: number is not exactly representable")
	ErrUnsupportedType = errors.New("fingerprint: unsupported value type")
	ErrUnknownVersion  = errors.New("fingerprint: unknown hash version")
)

// Number is a JSON number literal as a client sent it (for example "10.50"
// or "1e3"). Version 2 accepts it only if it is exact (see the package
// documentation).
type Number string

// Hash returns the current version's fingerprint of a normalised command:
// operation is the operation name, fields the normalised command (including
// path parameters and semantic headers, excluding Authorization and the
// idempotency key). Values may be nil, bool, string, Go integers, float64,
// Number, []any and map[string]any.
func Hash(operation string, fields map[string]any) (string, error) {
	return HashVersion(Version, operation, fields)
}

// Hashes returns the fingerprint under every supported version, current
// first: what idem.BeginRequest.RequestHashes holds. A command that version
// 2 rejects is an error, whatever older versions would have done.
//
// Where version 1 was exact (no Go integer beyond 2^53 in magnitude, see
// [Equivalent]), its hash is the current one under the old prefix, and
// Hashes takes it from there instead of canonicalising the command a second
// time with encoding/json and gowebpki/jcs (two thirds of its cost).
func Hashes(operation string, fields map[string]any) ([]string, error) {
	out := make([]string, 0, len(Versions()))
	for _, v := range Versions() {
		if v == 1 && exactInV1(fields) {
			out = append(out, "v1:"+out[0][len("v2:"):])
			continue
		}
		h, err := HashVersion(v, operation, fields)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// maxExactV1 is the largest integer magnitude version 1 kept exact: it read
// every number as a double.
const maxExactV1 = 1 << 53

// exactInV1 reports whether version 1 canonicalised v (a value version 2
// accepted) to the same bytes as version 2: true unless v holds a Go
// integer beyond 2^53 in magnitude, which version 1 rounded to a double.
// Strings, bools, nulls, float64 and Number values (exact by version 2's
// rule) read the same in both versions.
func exactInV1(v any) bool {
	switch v := v.(type) {
	case int:
		return v >= -maxExactV1 && v <= maxExactV1
	case int64:
		return v >= -maxExactV1 && v <= maxExactV1
	case uint:
		return v <= maxExactV1
	case uint64:
		return v <= maxExactV1
	case []any:
		for _, e := range v {
			if !exactInV1(e) {
				return false
			}
		}
	case map[string]any:
		for _, e := range v {
			if !exactInV1(e) {
				return false
			}
		}
	}
	// Smaller integer types, and every other type version 2 accepts.
	return true
}

// HashVersion returns the fingerprint under one supported version.
func HashVersion(version int, operation string, fields map[string]any) (string, error) {
	var (
		canonical []byte
		err       error
	)
	switch version {
	case 2:
		canonical, err = canonicalV2(operation, fields)
	case 1:
		canonical, err = canonicalV1(operation, fields)
	default:
		return "", fmt.Errorf("%w: %d", ErrUnknownVersion, version)
	}
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canonical)
	var h [len("vN:") + 2*sha256.Size]byte
	h[0], h[1], h[2] = 'v', byte('0'+version), ':'
	hex.Encode(h[3:], sum[:])
	return string(h[:]), nil
}

// Canonical returns the bytes Hash hashes (the current version's canonical
// form), for diagnostics and for clients checking their own implementation.
func Canonical(operation string, fields map[string]any) ([]byte, error) {
	return canonicalV2(operation, fields)
}

// Equivalent returns h followed by the hashes of older supported versions
// that stand for the same command: for "v2:X" it is ["v2:X", "v1:X"]. Equal
// SHA-256 means equal canonical bytes, and wherever version 1 was exact its
// canonical form is version 2's byte for byte, so a record stored as "v1:X"
// was made by the same command. It lets a caller that sends only a
// current-version hash (the coordination API's requestHash) still replay
// and conflict against records written under version 1. Any other h is
// returned alone.
func Equivalent(h string) []string {
	if VersionOf(h) != 2 || !strings.HasPrefix(h, "v2:") {
		return []string{h}
	}
	return []string{h, "v1:" + strings.TrimPrefix(h, "v2:")}
}

// VersionOf returns the version of a "v<N>:<hex>" hash, or 0 if h has no such
// prefix.
func VersionOf(h string) int {
	v, _, ok := strings.Cut(h, ":")
	if !ok || len(v) < 2 || v[0] != 'v' {
		return 0
	}
	n, err := strconv.Atoi(v[1:])
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// canonicalV2 writes the document (fields and "operation") as appendValue
// writes a map, without copying fields into one.
func canonicalV2(operation string, fields map[string]any) ([]byte, error) {
	if _, ok := fields["operation"]; ok {
		return nil, ErrReservedName
	}
	return appendObject(make([]byte, 0, 256), fields, "operation", operation)
}

// appendObject writes m as an RFC 8785 object, with one more member (name,
// value) when name is not empty: canonicalV2's "operation", which m does
// not hold, written without copying m into a map that does.
func appendObject(b []byte, m map[string]any, name string, value any) ([]byte, error) {
	keys := make([]string, 0, len(m)+1)
	for k := range m {
		if !utf8.ValidString(k) {
			return nil, ErrInvalidUTF8
		}
		keys = append(keys, k)
	}
	if name != "" {
		keys = append(keys, name)
	}
	// RFC 8785 sorts names by their UTF-16 code units.
	slices.SortFunc(keys, compareUTF16)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendString(b, k); err != nil {
			return nil, err
		}
		b = append(b, ':')
		v := value
		if name == "" || k != name {
			v = m[k]
		}
		if b, err = appendValue(b, v); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case string:
		return appendString(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int8:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint8:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint64:
		return strconv.AppendUint(b, v, 10), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: %v", ErrInexactNumber, v)
		}
		s, err := jcs.NumberToJSON(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInexactNumber, err)
		}
		return append(b, s...), nil
	case Number:
		s, err := canonicalNumber(string(v))
		if err != nil {
			return nil, err
		}
		return append(b, s...), nil
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendValue(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		return appendObject(b, v, "", nil)
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedType, v)
	}
}

// compareUTF16 orders a and b (valid UTF-8) by their UTF-16 code units,
// as RFC 8785 sorts names, without encoding them: the first runes that
// differ decide, by their UTF-16 encodings (a rune beyond the BMP is a
// surrogate pair, which sorts below U+E000..U+FFFF).
func compareUTF16(a, b string) int {
	// Valid UTF-8 sorts bytewise as its code points do, which is UTF-16's
	// order but for a rune beyond the BMP (lead byte 0xF0 to 0xF4) against
	// one of U+E000..U+FFFF (lead byte 0xEE or 0xEF). At the first byte
	// that differs both strings start a rune, or both continue runes of
	// one class: the runes are decoded only when that byte is 0xEE or
	// above in either.
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) || i == len(b) {
		return cmp.Compare(len(a), len(b))
	}
	if x, y := a[i], b[i]; x < 0xEE && y < 0xEE {
		return cmp.Compare(x, y)
	}
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return compareUnits(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// compareUnits compares two different runes by their UTF-16 encodings.
func compareUnits(a, b rune) int {
	ua, ub := utf16Units(a), utf16Units(b)
	return slices.Compare(ua[:], ub[:])
}

// utf16Units is r's UTF-16 encoding, its second unit 0 for a rune in the
// BMP (an encoding of one unit sorts before any longer one that starts
// with the same unit, and 0 sorts first).
func utf16Units(r rune) [2]rune {
	if r < 0x10000 {
		return [2]rune{r, 0}
	}
	hi, lo := utf16.EncodeRune(r)
	return [2]rune{hi, lo}
}

// appendString writes s as RFC 8785 does: the two-character escapes for
// \b \t \n \f \r " and \, \u00xx (lower-case hex) for other C0 controls, and
// every other character as itself.
func appendString(b []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return nil, ErrInvalidUTF8
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\b':
			b = append(b, `\b`...)
		case '\t':
			b = append(b, `\t`...)
		case '\n':
			b = append(b, `\n`...)
		case '\f':
			b = append(b, `\f`...)
		case '\r':
			b = append(b, `\r`...)
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		default:
			if c < 0x20 {
				b = append(b, `\u00`...)
				b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"'), nil
}

// canonicalNumber returns the RFC 8785 form of a JSON number literal, or
// ErrInexactNumber if that form denotes a different value than lit.
func canonicalNumber(lit string) (string, error) {
	litVal, ok := decimalOf(lit)
	if !ok {
		return "", fmt.Errorf("%w: not a JSON number", ErrInexactNumber)
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return "", ErrInexactNumber
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInexactNumber, err)
	}
	if canVal, ok := decimalOf(s); !ok || canVal != litVal {
		return "", ErrInexactNumber
	}
	return s, nil
}

// decimal is a number's value as sign, significant digits (no leading or
// trailing zeros) and the position of the decimal point relative to them:
// value = 0.<digits> * 10^point. Zero is the zero decimal, whatever its sign.
type decimal struct {
	neg    bool
	digits string
	point  int64
}

// decimalOf reads a JSON number literal (RFC 8259 grammar).
func decimalOf(s string) (decimal, bool) {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	mant, exp, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, exp, hasExp = strings.Cut(s, "E")
	}
	intPart, frac, hasDot := strings.Cut(mant, ".")
	if intPart == "" || !allDigits(intPart) || (len(intPart) > 1 && intPart[0] == '0') ||
		(hasDot && (frac == "" || !allDigits(frac))) {
		return decimal{}, false
	}
	if hasExp {
		e := exp
		if e != "" && (e[0] == '+' || e[0] == '-') {
			e = e[1:]
		}
		if e == "" || !allDigits(e) {
			return decimal{}, false
		}
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	point := int64(len(intPart)) - int64(len(intPart+frac)-len(digits))
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return decimal{}, true // zero, whatever its sign and exponent
	}
	if hasExp {
		e, err := strconv.ParseInt(exp, 10, 32)
		if err != nil {
			return decimal{}, false
		}
		point += e
	}
	d.digits, d.point = digits, point
	return d, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// canonicalV1 is version 1, unchanged: encoding/json then gowebpki/jcs.
func canonicalV1(operation string, fields map[string]any) ([]byte, error) {
	doc := make(map[string]any, len(fields)+1)
	for k, v := range fields {
		doc[k] = v1Value(v)
	}
	doc["operation"] = operation
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: marshal command: %w", err)
	}
	canonical, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: canonicalise command: %w", err)
	}
	return canonical, nil
}

// v1Value turns Numbers into encoding/json numbers, which jcs reads as the
// doubles version 1 always read client numbers as.
func v1Value(v any) any {
	switch v := v.(type) {
	case Number:
		return json.Number(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = v1Value(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = v1Value(e)
		}
		return out
	}
	return v
}

// Package strictjson is the one JSON decoder for every body the product reads
// from outside: payment commands, coordination API bodies and the provider
// simulator's bodies.
//
// A body is accepted only if it is exactly one JSON object (RFC 8259) that
//
//   - names every member exactly as the destination's `json` tag spells it
//     (case-sensitive: "ACCOUNTID" is not "accountId"),
//   - has no member name twice in any object, at any depth,
//   - is valid UTF-8 throughout (no replacement of invalid bytes),
//   - nests at most [MaxDepth] arrays and objects deep,
//   - has nothing but white space after the object.
//
// Members unknown to the destination are rejected. The size of a body is
// bounded by the caller, which reads it through [net/http.MaxBytesReader].
//
// Decoding is done by github.com/go-json-experiment/json (the JSON v2
// prototype), whose defaults already match exactly and reject duplicate names
// and invalid UTF-8; this package fixes the options in one place and sorts
// its errors into the three kinds callers answer differently. Destinations
// use [jsontext.Value] (not encoding/json.RawMessage) for members kept raw.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
)

// MaxDepth is the deepest nesting of arrays and objects a body may have,
// counting the body's own object as 1.
const MaxDepth = 32

// Kind sorts decoding errors by how a caller answers them.
type Kind int

// Kinds of Error.
const (
	// Malformed: not one JSON object, a syntax error, a duplicate member
	// name, invalid UTF-8, nesting deeper than MaxDepth, or trailing data.
	Malformed Kind = iota + 1
	// UnknownMember: a member the destination does not have (names are
	// matched exactly).
	UnknownMember
	// WrongType: a member's value does not fit the destination's type.
	WrongType
)

// Error is a decoding error. Its text may quote the input; callers answering
// a client use Kind and Field, never Error().
type Error struct {
	Kind Kind
	// Field is the top-level member the error is in, when that member is
	// one the destination declares (so it is never a client-chosen string);
	// "" otherwise.
	Field string
	Err   error
}

func (e *Error) Error() string {
	kind := map[Kind]string{Malformed: "malformed JSON", UnknownMember: "unknown member", WrongType: "wrong type"}[e.Kind]
	if e.Field != "" {
		kind += " in " + e.Field
	}
	return "strictjson: " + kind + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrNotObject is the cause of a Malformed error for a body that is valid JSON
// but not an object (an array, a string, null...).
var ErrNotObject = errors.New("the value is not a JSON object")

var (
	errTrailing = errors.New("data after the JSON object")
	errTooDeep  = errors.New("nested too deep")
)

// DecodeObject decodes data, which must hold exactly one JSON object, into
// dst (a non-nil pointer, usually to a struct). Errors are *Error.
func DecodeObject(data []byte, dst any) error {
	obj, err := Object(data)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(obj, dst, json.RejectUnknownMembers(true)); err != nil {
		var semErr *json.SemanticError
		if errors.As(err, &semErr) {
			e := &Error{Kind: WrongType, Field: declaredField(dst, semErr.JSONPointer), Err: err}
			if errors.Is(semErr.Err, json.ErrUnknownName) {
				e.Kind, e.Field = UnknownMember, ""
			}
			return e
		}
		return &Error{Kind: Malformed, Err: err}
	}
	return nil
}

// Object checks that data holds exactly one JSON object under the package's
// rules (without matching it against a destination) and returns it without
// the surrounding white space. Errors are *Error of Kind Malformed.
func Object(data []byte) (jsontext.Value, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	first := true
	for {
		tok, err := dec.ReadToken()
		if err == io.EOF && !first {
			break
		}
		if err != nil {
			return nil, &Error{Kind: Malformed, Err: err}
		}
		if first && tok.Kind() != '{' {
			return nil, &Error{Kind: Malformed, Err: ErrNotObject}
		}
		first = false
		if dec.StackDepth() > MaxDepth {
			return nil, &Error{Kind: Malformed, Err: errTooDeep}
		}
		if dec.StackDepth() == 0 {
			if _, err := dec.ReadToken(); err != io.EOF {
				return nil, &Error{Kind: Malformed, Err: errTrailing}
			}
			break
		}
	}
	return jsontext.Value(bytes.Trim(data, " \t\r\n")), nil
}

// ClientError turns an error of DecodeObject into the *idem.Error a client
// sees (nil stays nil): REQUEST_MALFORMED for Malformed bodies,
// REQUEST_VALIDATION_FAILED for a body that is valid JSON but not an object,
// for unknown members and for wrong types. Messages never quote the body;
// the cause is kept for the log.
func ClientError(err error) error {
	var e *Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotObject):
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: "The body must be a JSON object.", Err: err}
	case !errors.As(err, &e) || e.Kind == Malformed:
		return &idem.Error{Code: idem.ECodeRequestMalformed,
			Message: fmt.Sprintf("The body is not one valid JSON object (each member name once and exactly as documented, valid UTF-8, at most %d levels deep, nothing after it).", MaxDepth), Err: err}
	case e.Kind == UnknownMember:
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: "The body has an unknown field (names are case-sensitive).", Err: err}
	case e.Field != "":
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("Field %q has the wrong type or an invalid value.", e.Field), Err: err}
	default:
		return &idem.Error{Code: idem.ECodeValidationFailed, Message: "A field has the wrong type or an invalid value.", Err: err}
	}
}

// declaredField returns the first token of ptr if dst points to a struct
// declaring a member of that exact name.
func declaredField(dst any, ptr jsontext.Pointer) string {
	first := ""
	for tok := range ptr.Tokens() {
		first = tok
		break
	}
	if first == "" {
		return ""
	}
	t := reflect.TypeOf(dst)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return ""
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" && f.IsExported() {
			name = f.Name
		}
		if name == first {
			return first
		}
	}
	return ""
}

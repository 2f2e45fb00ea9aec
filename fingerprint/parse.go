package fingerprint

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem/internal/strictjson"
)

// ParseObject reads a JSON object sent by a client into the values Hash
// takes: objects as map[string]any, arrays as []any, numbers as Number
// (never float64), strings, bools and nil. raw must pass the rules of
// package strictjson (one object, no duplicate names, valid UTF-8, bounded
// depth); every number must be exact (ErrInexactNumber), so that what is
// hashed is what the client sent.
func ParseObject(raw []byte) (map[string]any, error) {
	obj, err := strictjson.Object(raw)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	dec := jsontext.NewDecoder(bytes.NewReader(obj))
	v, err := readValue(dec)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("fingerprint: not an object")
	}
	return m, nil
}

func readValue(dec *jsontext.Decoder) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return tok.Bool(), nil
	case '"':
		return tok.String(), nil
	case '0':
		n := Number(tok.String())
		if _, err := canonicalNumber(string(n)); err != nil {
			return nil, err
		}
		return n, nil
	case '[':
		out := []any{}
		for dec.PeekKind() != ']' {
			v, err := readValue(dec)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, fmt.Errorf("fingerprint: %w", err)
		}
		return out, nil
	case '{':
		out := map[string]any{}
		for dec.PeekKind() != '}' {
			tok, err := dec.ReadToken()
			if err != nil {
				return nil, fmt.Errorf("fingerprint: %w", err)
			}
			name := tok.String()
			v, err := readValue(dec)
			if err != nil {
				return nil, err
			}
			out[name] = v
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, fmt.Errorf("fingerprint: %w", err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("fingerprint: unexpected token %v", tok.Kind())
}

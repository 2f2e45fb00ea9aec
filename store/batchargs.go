package store

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A batch statement of the group commit reads its rows from one array per
// column, unnest($1::TEXT[], $2::INT8[], ...), not from a VALUES list of
// n rows of parameters: its text is the same whatever the batch's size, so
// that each connection prepares it once and PostgreSQL plans it once
// (a generic plan), where a VALUES list was a statement of its own for
// every size, prepared on every connection and planned at every execution
// (about half a millisecond for a batch of claims, more than executing it).

// batchTypes are the SQL types a batch column may have.
var batchTypes = map[string]bool{"TEXT": true, "JSONB": true, "INT4": true, "INT8": true, "BOOL": true, "BYTEA": true}

// checkBatchTypes reports a type a batch column cannot have.
func checkBatchTypes(types []string) error {
	for _, t := range types {
		if !batchTypes[t] {
			return fmt.Errorf("store: batch column of type %q (want one of TEXT, JSONB, INT4, INT8, BOOL, BYTEA)", t)
		}
	}
	return nil
}

// unnestRows is the FROM item of a batch's rows: one array parameter per
// column of types, numbered from $first, named names. A JSONB column is
// sent as TEXT (its elements are JSON text) and cast back, so that an
// array of it can be sent in any query mode, a pooler's included.
func unnestRows(alias string, first int, types, names []string) string {
	var arrays, sel []string
	for j, t := range types {
		p := "$" + strconv.Itoa(first+j)
		if t == "JSONB" {
			arrays = append(arrays, p+"::TEXT[]")
			sel = append(sel, "u."+names[j]+"::JSONB AS "+names[j])
			continue
		}
		arrays = append(arrays, p+"::"+t+"[]")
		sel = append(sel, "u."+names[j])
	}
	return `(SELECT ` + strings.Join(sel, ", ") + ` FROM unnest(` + strings.Join(arrays, ", ") + `) AS u(` +
		strings.Join(names, ", ") + `)) AS ` + alias
}

// columnArrays turns a batch's rows of arguments, each in types' order,
// into one array argument per column, as unnestRows reads them. An
// argument is a value, a pointer to one or nil (NULL): string or []byte
// for TEXT and JSONB, an integer for INT4 and INT8, bool, []byte for BYTEA.
func columnArrays(types []string, rows [][]any) ([]any, error) {
	cols := make([]any, len(types))
	for j, t := range types {
		var err error
		switch t {
		case "TEXT", "JSONB":
			cols[j], err = column(rows, j, textArg)
		case "INT4":
			cols[j], err = column(rows, j, int4Arg)
		case "INT8":
			cols[j], err = column(rows, j, func(v any) (*int64, error) { return intArg(v, "INT8") })
		case "BOOL":
			cols[j], err = column(rows, j, boolArg)
		case "BYTEA":
			cols[j], err = column(rows, j, byteaArg)
		default:
			err = checkBatchTypes([]string{t})
		}
		if err != nil {
			return nil, fmt.Errorf("store: batch column %d: %w", j+1, err)
		}
	}
	return cols, nil
}

// column is the j-th argument of every row, each converted by conv.
func column[T any](rows [][]any, j int, conv func(any) (T, error)) ([]T, error) {
	col := make([]T, len(rows))
	for i, r := range rows {
		v, err := conv(r[j])
		if err != nil {
			return nil, err
		}
		col[i] = v
	}
	return col, nil
}

// valueArg is v as a *T: nil, a T or a *T.
func valueArg[T any](v any, typ string) (*T, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case T:
		return &v, nil
	case *T:
		return v, nil
	}
	return nil, fmt.Errorf("a %T for %s", v, typ)
}

func textArg(v any) (*string, error) {
	if b, ok := v.([]byte); ok {
		if b == nil {
			return nil, nil
		}
		s := string(b)
		return &s, nil
	}
	return valueArg[string](v, "TEXT")
}

func intArg(v any, typ string) (*int64, error) {
	var n int64
	switch v := v.(type) {
	case nil:
		return nil, nil
	case int64:
		n = v
	case *int64:
		return v, nil
	case int:
		n = int64(v)
	case *int:
		if v == nil {
			return nil, nil
		}
		n = int64(*v)
	case int32:
		n = int64(v)
	case *int32:
		if v == nil {
			return nil, nil
		}
		n = int64(*v)
	default:
		return nil, fmt.Errorf("a %T for %s", v, typ)
	}
	return &n, nil
}

func int4Arg(v any) (*int32, error) {
	n, err := intArg(v, "INT4")
	if err != nil || n == nil {
		return nil, err
	}
	if *n < math.MinInt32 || *n > math.MaxInt32 {
		return nil, fmt.Errorf("%d out of INT4's range", *n)
	}
	m := int32(*n)
	return &m, nil
}

func boolArg(v any) (*bool, error) {
	return valueArg[bool](v, "BOOL")
}

func byteaArg(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return v, nil
	case string:
		return []byte(v), nil
	}
	return nil, fmt.Errorf("a %T for BYTEA", v)
}

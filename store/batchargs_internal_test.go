package store

import (
	"reflect"
	"strings"
	"testing"
)

func TestColumnArrays(t *testing.T) {
	s, n4, n8, yes := "a", int32(7), int64(9), true
	var nilText *string
	rows := [][]any{
		{"x", int32(1), int64(2), true, []byte("b1"), `{"k":1}`},
		{&s, &n4, &n8, &yes, "b2", []byte(`[]`)},
		{nil, nil, nil, nil, nil, nilText},
		{[]byte(nil), 3, 4, false, []byte(nil), nil},
	}
	got, err := columnArrays([]string{"TEXT", "INT4", "INT8", "BOOL", "BYTEA", "JSONB"}, rows)
	if err != nil {
		t.Fatal(err)
	}
	str := func(v string) *string { return &v }
	i4 := func(v int32) *int32 { return &v }
	i8 := func(v int64) *int64 { return &v }
	b := func(v bool) *bool { return &v }
	want := []any{
		[]*string{str("x"), str("a"), nil, nil},
		[]*int32{i4(1), i4(7), nil, i4(3)},
		[]*int64{i8(2), i8(9), nil, i8(4)},
		[]*bool{b(true), b(true), nil, b(false)},
		[][]byte{[]byte("b1"), []byte("b2"), nil, nil},
		[]*string{str(`{"k":1}`), str(`[]`), nil, nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("columnArrays = %#v, want %#v", got, want)
	}
}

func TestColumnArraysRefusesWhatItCannotSend(t *testing.T) {
	for _, c := range []struct {
		typ  string
		v    any
		want string
	}{
		{"TEXT", 1, "a int for TEXT"},
		{"INT8", "1", "a string for INT8"},
		{"INT4", int64(1) << 40, "out of INT4's range"},
		{"BOOL", 1, "a int for BOOL"},
		{"BYTEA", 1.5, "a float64 for BYTEA"},
		{"NUMERIC", 1, `type "NUMERIC"`},
	} {
		_, err := columnArrays([]string{"TEXT", c.typ}, [][]any{{"ok", c.v}})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "column 2") {
			t.Errorf("%s of %#v: error %v, want one naming column 2 and %q", c.typ, c.v, err, c.want)
		}
	}
}

func TestUnnestRowsSendsJSONBAsText(t *testing.T) {
	got := unnestRows("v", 3, []string{"TEXT", "JSONB", "INT8"}, []string{"t", "j", "n"})
	want := `(SELECT u.t, u.j::JSONB AS j, u.n FROM unnest($3::TEXT[], $4::TEXT[], $5::INT8[]) AS u(t, j, n)) AS v`
	if got != want {
		t.Fatalf("unnestRows = %s\nwant %s", got, want)
	}
}

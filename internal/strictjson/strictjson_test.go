package strictjson

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
)

type body struct {
	AccountID *string        `json:"accountId"`
	Amount    jsontext.Value `json:"amount"`
	Token     *int64         `json:"fencingToken"`
	Nested    *struct {
		Headers map[string]string `json:"headers"`
	} `json:"nested"`
}

func kindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

func TestDecodeObjectAccepts(t *testing.T) {
	var b body
	if err := DecodeObject([]byte(" {\"accountId\":\"acc_1\",\"amount\":10.50,\"fencingToken\":3,\"nested\":{\"headers\":{\"A\":\"b\"}}}\n"), &b); err != nil {
		t.Fatal(err)
	}
	if *b.AccountID != "acc_1" || string(b.Amount) != "10.50" || *b.Token != 3 || b.Nested.Headers["A"] != "b" {
		t.Errorf("decoded %+v", b)
	}
}

func TestDecodeObjectRejects(t *testing.T) {
	deep := strings.Repeat(`{"a":`, MaxDepth) + `1` + strings.Repeat(`}`, MaxDepth)
	for _, tc := range []struct {
		name, in string
		kind     Kind
	}{
		{"name in other case", `{"accountId":"acc_b","ACCOUNTID":"acc_victim"}`, UnknownMember},
		{"only other case", `{"AccountId":"acc_b"}`, UnknownMember},
		{"duplicate name", `{"amount":"1.00","amount":"2.00"}`, Malformed},
		{"duplicate token", `{"fencingToken":1,"fencingToken":2}`, Malformed},
		{"nested duplicate", `{"nested":{"headers":{"A":"1","A":"2"}}}`, Malformed},
		{"duplicate via escape", `{"accountId":"a","accountI\u0064":"b"}`, Malformed},
		{"invalid utf-8", "{\"accountId\":\"a\xffb\"}", Malformed},
		{"invalid utf-8 in raw value", "{\"amount\":\"\xc3\"}", Malformed},
		{"lone surrogate", `{"accountId":"\ud800"}`, Malformed},
		{"trailing object", `{} {}`, Malformed},
		{"trailing garbage", `{}x`, Malformed},
		{"array", `[1]`, Malformed},
		{"null", `null`, Malformed},
		{"empty", ``, Malformed},
		{"truncated", `{"accountId":`, Malformed},
		{"too deep", `{"nested":` + deep + `}`, Malformed},
		{"unknown member", `{"foo":1}`, UnknownMember},
		{"wrong type", `{"fencingToken":"1"}`, WrongType},
		{"fraction for int", `{"fencingToken":1.5}`, WrongType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b body
			err := DecodeObject([]byte(tc.in), &b)
			if got := kindOf(err); got != tc.kind {
				t.Errorf("kind = %d (err %v), want %d", got, err, tc.kind)
			}
		})
	}
}

func TestErrorFieldIsOnlyADeclaredName(t *testing.T) {
	var b body
	err := DecodeObject([]byte(`{"fencingToken":"x"}`), &b)
	var e *Error
	if !errors.As(err, &e) || e.Field != "fencingToken" {
		t.Errorf("err = %#v, want WrongType in fencingToken", err)
	}
	err = DecodeObject([]byte(`{"nested":{"headers":{"<script>":1}}}`), &b)
	if !errors.As(err, &e) || e.Kind != WrongType || e.Field != "nested" {
		t.Errorf("err = %#v, want WrongType in nested", err)
	}
	err = DecodeObject([]byte(`{"<script>":1}`), &b)
	if !errors.As(err, &e) || e.Field != "" {
		t.Errorf("err = %#v, want no field for an unknown member", err)
	}
}

// FuzzDecodeObject checks that decoding never panics, that an accepted body
// is a single valid JSON object whose names are all declared, and that
// accepting is deterministic.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{
		`{"accountId":"acc_1","amount":"10.00"}`, `{"amount":1e400}`, `{"fencingToken":9223372036854775808}`,
		`{"accountId":"a","ACCOUNTID":"b"}`, `{"amount":1,"amount":2}`, "{\"accountId\":\"\xff\"}",
		`{"nested":{"headers":{"a":"b"}}}`, `{} {}`, `[]`, `{"accountId":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var b body
		err := DecodeObject(in, &b)
		var b2 body
		err2 := DecodeObject(in, &b2)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("decoding is not deterministic: %v vs %v", err, err2)
		}
		if err != nil {
			if kindOf(err) == 0 {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		v, err := Object(in)
		if err != nil {
			t.Fatalf("DecodeObject accepted what Object rejects: %v", err)
		}
		if !v.IsValid() || v.Kind() != '{' {
			t.Fatalf("accepted %q is not one valid object", in)
		}
		if len(b.Amount) > 0 && !b.Amount.IsValid() {
			t.Fatalf("raw member %q is not valid JSON", b.Amount)
		}
	})
}

func TestClientError(t *testing.T) {
	for _, tc := range []struct{ in, code string }{
		{`{"accountId":"a"}`, ""},
		{`{"amount":1,"amount":2}`, idem.ECodeRequestMalformed},
		{`{} {}`, idem.ECodeRequestMalformed},
		{`[]`, idem.ECodeValidationFailed},
		{`{"<b>secret</b>":1}`, idem.ECodeValidationFailed},
		{`{"fencingToken":"x"}`, idem.ECodeValidationFailed},
	} {
		var b body
		err := ClientError(DecodeObject([]byte(tc.in), &b))
		if got := idem.ErrorCode(err); got != tc.code {
			t.Errorf("ClientError(%s) code = %q, want %q", tc.in, got, tc.code)
		}
		if strings.Contains(idem.ErrorMessage(err), "secret") {
			t.Errorf("message %q quotes the body", idem.ErrorMessage(err))
		}
	}
}

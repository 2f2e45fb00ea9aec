package payments

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/ident"
)

func mustParse(t *testing.T, body, version string) Command {
	t.Helper()
	c, err := ParseCommand([]byte(body), version)
	if err != nil {
		t.Fatalf("ParseCommand(%s): %v", body, err)
	}
	return c
}

func hashOf(t *testing.T, c Command) string {
	t.Helper()
	h, err := c.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	return h[0]
}

func TestEquivalentCommandsHashAlike(t *testing.T) {
	base := `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`
	want := hashOf(t, mustParse(t, base, ""))
	for _, tc := range []struct{ name, body, version string }{
		{"field order and case", `{"currency":"eur","amount":"10.0","merchantReference":"invoice-7781","accountId":"acc_1"}`, ""},
		{"default channel spelled out", `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781","channel":"web"}`, ""},
		{"channel case", `{"accountId":"acc_1","amount":"10","currency":"EUR","merchantReference":"invoice-7781","channel":"WEB"}`, ""},
		{"amount as number", `{"accountId":"acc_1","amount":10.000,"currency":"EUR","merchantReference":"invoice-7781"}`, ""},
		{"whitespace", " {\n \"accountId\" : \"acc_1\", \"amount\":\"010.00\",\"currency\":\"EUR\",\"merchantReference\":\"invoice-7781\"}\n", ""},
		{"explicit default api version", base, DefaultAPIVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hashOf(t, mustParse(t, tc.body, tc.version)); got != want {
				t.Errorf("hash = %s, want %s", got, want)
			}
		})
	}
}

func TestDifferentCommandsHashApart(t *testing.T) {
	base := hashOf(t, mustParse(t, `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"r"}`, ""))
	for _, body := range []string{
		`{"accountId":"acc_1","amount":"100.00","currency":"EUR","merchantReference":"r"}`,
		`{"accountId":"acc_2","amount":"10.00","currency":"EUR","merchantReference":"r"}`,
		`{"accountId":"acc_1","amount":"10.00","currency":"USD","merchantReference":"r"}`,
		`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"R"}`,
		`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"r","channel":"mobile"}`,
		`{"accountId":"acc_1","amount":"10.01","currency":"EUR","merchantReference":"r"}`,
	} {
		if got := hashOf(t, mustParse(t, body, "")); got == base {
			t.Errorf("%s hashes like the base command", body)
		}
	}
}

func TestParseCommandRejects(t *testing.T) {
	for _, tc := range []struct{ name, body, version, code string }{
		{"not json", `{"accountId":`, "", idem.ECodeRequestMalformed},
		{"array", `[1]`, "", idem.ECodeValidationFailed},
		{"two objects", `{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"r"} {}`, "", idem.ECodeRequestMalformed},
		{"unknown field", `{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"r","foo":"bar"}`, "", idem.ECodeValidationFailed},
		{"missing account", `{"amount":"1","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"missing amount", `{"accountId":"a","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"zero amount", `{"accountId":"a","amount":"0.00","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"negative amount", `{"accountId":"a","amount":"-1","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"too precise", `{"accountId":"a","amount":"10.001","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"yen fraction", `{"accountId":"a","amount":"10.5","currency":"JPY","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"exponent", `{"accountId":"a","amount":1e3,"currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"unknown currency", `{"accountId":"a","amount":"1","currency":"XXX","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"bad channel", `{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"r","channel":"fax"}`, "", idem.ECodeValidationFailed},
		{"wrong type", `{"accountId":5,"amount":"1","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"huge amount", `{"accountId":"a","amount":"12345678901234567890","currency":"EUR","merchantReference":"r"}`, "", idem.ECodeValidationFailed},
		{"api version", `{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"r"}`, "1999-01-01", idem.ECodeAPIVersionUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCommand([]byte(tc.body), tc.version)
			if got := idem.ErrorCode(err); got != tc.code {
				t.Errorf("code = %q (err %v), want %q", got, err, tc.code)
			}
			var e *idem.Error
			if !errors.As(err, &e) {
				t.Errorf("error %v is not an *idem.Error", err)
			}
		})
	}
}

func TestFormatMinor(t *testing.T) {
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{{1000, "EUR", "10.00"}, {5, "EUR", "0.05"}, {1234, "JPY", "1234"}, {1, "BHD", "0.001"}} {
		if got := FormatMinor(tc.minor, tc.currency); got != tc.want {
			t.Errorf("FormatMinor(%d, %s) = %s, want %s", tc.minor, tc.currency, got, tc.want)
		}
	}
}

// FuzzParseCommand checks that the parser never panics, that every accepted
// command is normalised (re-serialising it parses back to the same command and
// hash), that its enums and identifiers obey the rules, that its fingerprint
// is deterministic under every supported version, and that rejections carry a
// stable code.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`,
		`{"currency":"eur","amount":"10.0","merchantReference":"m","accountId":"a","channel":"Mobile"}`,
		`{"accountId":"a","amount":10,"currency":"JPY","merchantReference":"r"}`,
		`{"accountId":"a","amount":"0.001","currency":"BHD","merchantReference":"r"}`,
		`{`, `[]`, `null`, `{"foo":1}`,
		`{"accountId":"acc_b","ACCOUNTID":"acc_victim","amount":"1","currency":"EUR","merchantReference":"r"}`,
		`{"accountId":"a","amount":"1.00","amount":"2.00","currency":"EUR","merchantReference":"r"}`,
		`{"accountId":"a","amount":"999999999999999.99","currency":"EUR","merchantReference":"r"}`,
		`{"accountId":"a","amount":"1","currency":"u\u017fd","merchantReference":"r"}`,
		`{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"cafe\u0301"}`,
		`{"accountId":"a\u202e","amount":"1","currency":"EUR","merchantReference":"r"}`,
		"{\"accountId\":\"a\xff\",\"amount\":\"1\",\"currency\":\"EUR\",\"merchantReference\":\"r\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := ParseCommand(body, "")
		if err != nil {
			switch idem.ErrorCode(err) {
			case idem.ECodeRequestMalformed, idem.ECodeValidationFailed:
			default:
				t.Fatalf("unexpected error code for %q: %v", body, err)
			}
			return
		}
		if c.AmountMinor <= 0 {
			t.Fatalf("accepted non-positive amount %d from %q", c.AmountMinor, body)
		}
		if _, ok := currencyExponents[c.Currency]; !ok || !channels[c.Channel] {
			t.Fatalf("accepted enum values outside the tables: %+v", c)
		}
		if ident.Check(c.AccountID) != nil || ident.Check(c.MerchantReference) != nil {
			t.Fatalf("accepted identifiers that ident rejects: %+v", c)
		}
		h1, err1 := c.Fingerprint()
		h2, err2 := c.Fingerprint()
		if err1 != nil || err2 != nil || len(h1) != len(fingerprint.Versions()) || strings.Join(h1, ",") != strings.Join(h2, ",") ||
			fingerprint.VersionOf(h1[0]) != fingerprint.Version {
			t.Fatalf("fingerprint not deterministic or not versioned: %v %v (%v, %v)", h1, h2, err1, err2)
		}
		again := `{"accountId":` + quote(c.AccountID) + `,"amount":"` + c.Amount() + `","currency":"` + c.Currency +
			`","merchantReference":` + quote(c.MerchantReference) + `,"channel":"` + c.Channel + `"}`
		c2, err := ParseCommand([]byte(again), "")
		if err != nil {
			t.Fatalf("normalised form %s does not parse: %v", again, err)
		}
		if c2 != c {
			t.Fatalf("round trip changed the command: %+v -> %+v", c, c2)
		}
		if hashOf(t, c) != hashOf(t, c2) {
			t.Fatalf("round trip changed the hash")
		}
	})
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

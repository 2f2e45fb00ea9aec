package payments

import (
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
)

const okBody = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`

// TestLargeAmountsHashApart: amounts above 2^53 minor units used to pass
// through a double while hashing, so these two commands hashed alike and the
// second was answered as a replay of the first.
func TestLargeAmountsHashApart(t *testing.T) {
	a := mustParse(t, `{"accountId":"acc_1","amount":"999999999999999.99","currency":"EUR","merchantReference":"r"}`, "")
	b := mustParse(t, `{"accountId":"acc_1","amount":"999999999999999.98","currency":"EUR","merchantReference":"r"}`, "")
	if a.AmountMinor != 99999999999999999 || b.AmountMinor != 99999999999999998 {
		t.Fatalf("parsed %d and %d", a.AmountMinor, b.AmountMinor)
	}
	if hashOf(t, a) == hashOf(t, b) {
		t.Errorf("999999999999999.99 and 999999999999999.98 hash alike: %s", hashOf(t, a))
	}
}

// goldenPayments pins create_payment's request hash under every supported
// version. A change here breaks every stored record's comparison: it must be
// a new fingerprint version instead.
var goldenPayments = []struct {
	body string
	want []string // current version first
}{
	{okBody, []string{
		"v2:b08d40daf34d6c2ff9207fc46f7ed2959f1ae7619eec43c392b6b9911314dc75",
		"v1:b08d40daf34d6c2ff9207fc46f7ed2959f1ae7619eec43c392b6b9911314dc75",
	}},
	{`{"accountId":"acc_1","amount":"999999999999999.99","currency":"EUR","merchantReference":"r"}`, []string{
		"v2:cac7451bdf2acef8b33d6cc5087e72c7f4f7232dedcce789c0ecbd0c88845ba9",
		"v1:0c930490e3a337adba8e22f8538c60085841328085a5d4fd63199665899a902f",
	}},
	{`{"accountId":"acc_1","amount":"999999999999999.98","currency":"EUR","merchantReference":"r"}`, []string{
		"v2:9f3215b64d9781a387eb5a86f279dc4285bc2a0ee1ff95aa11c5738b2db2cdf6",
		"v1:0c930490e3a337adba8e22f8538c60085841328085a5d4fd63199665899a902f",
	}},
}

func TestGoldenPaymentHashes(t *testing.T) {
	for _, tc := range goldenPayments {
		got, err := mustParse(t, tc.body, "").Fingerprint()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("Fingerprint(%s) = %q, want %q", tc.body, got, tc.want)
		}
		if fingerprint.VersionOf(got[0]) != fingerprint.Version {
			t.Errorf("first hash %s is not of the current version %d", got[0], fingerprint.Version)
		}
	}
}

// TestParseCommandIsStrict: member names are case-sensitive and unique,
// and invalid UTF-8 is an error, never repaired.
func TestParseCommandIsStrict(t *testing.T) {
	for _, tc := range []struct{ name, body, code string }{
		{"name in other case", `{"accountId":"acc_b","ACCOUNTID":"acc_victim","amount":"1","currency":"EUR","merchantReference":"r"}`, idem.ECodeValidationFailed},
		{"only other case", `{"AccountId":"acc_victim","amount":"1","currency":"EUR","merchantReference":"r"}`, idem.ECodeValidationFailed},
		{"duplicate amount", `{"accountId":"a","amount":"1.00","amount":"2.00","currency":"EUR","merchantReference":"r"}`, idem.ECodeRequestMalformed},
		{"duplicate via escape", `{"accountId":"a","accountI\u0064":"b","amount":"1","currency":"EUR","merchantReference":"r"}`, idem.ECodeRequestMalformed},
		{"invalid utf-8", "{\"accountId\":\"a\xff\",\"amount\":\"1\",\"currency\":\"EUR\",\"merchantReference\":\"r\"}", idem.ECodeRequestMalformed},
		{"lone surrogate", `{"accountId":"a\udc00","amount":"1","currency":"EUR","merchantReference":"r"}`, idem.ECodeRequestMalformed},
		{"too deep", `{"accountId":"a","amount":"1","currency":"EUR","merchantReference":"r","x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, idem.ECodeRequestMalformed},
		{"amount object", `{"accountId":"a","amount":{"v":1},"currency":"EUR","merchantReference":"r"}`, idem.ECodeValidationFailed},
		{"null body", `null`, idem.ECodeValidationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCommand([]byte(tc.body), "")
			if got := idem.ErrorCode(err); got != tc.code {
				t.Errorf("code = %q (err %v), want %q", got, err, tc.code)
			}
			if strings.Contains(idem.ErrorMessage(err), "victim") {
				t.Errorf("message %q echoes the body", idem.ErrorMessage(err))
			}
		})
	}
}

// TestParseCommandUnicode: enums are ASCII (strings.ToUpper maps the long s
// and the dotless i to ASCII letters), identifiers must be NFC and free of
// controls and bidirectional overrides.
func TestParseCommandUnicode(t *testing.T) {
	with := func(field, value string) string {
		m := map[string]string{"accountId": `"acc_1"`, "amount": `"1.00"`, "currency": `"EUR"`, "merchantReference": `"r"`}
		m[field] = quote(value)
		return `{"accountId":` + m["accountId"] + `,"amount":` + m["amount"] + `,"currency":` + m["currency"] + `,"merchantReference":` + m["merchantReference"] + `}`
	}
	for _, tc := range []struct{ name, field, value string }{
		{"long s in currency", "currency", "u\u017fd"},
		{"dotless i in currency", "currency", "\u0131nr"},
		{"kelvin sign in currency", "currency", "\u212ard"},
		{"fullwidth currency", "currency", "\uff25\uff35\uff32"},
		{"nfd merchant reference", "merchantReference", "cafe\u0301"},
		{"rlo in merchant reference", "merchantReference", "inv\u202eoice"},
		{"isolate in account", "accountId", "acc\u2066_1"},
		{"lrm in account", "accountId", "acc_1\u200e"},
		{"c1 in account", "accountId", "acc\u0085"},
		{"del in account", "accountId", "acc\x7f"},
		{"nul in reference", "merchantReference", "r\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := with(tc.field, tc.value)
			if _, err := ParseCommand([]byte(body), ""); idem.ErrorCode(err) != idem.ECodeValidationFailed {
				t.Errorf("ParseCommand(%s) = %v, want %s", body, err, idem.ECodeValidationFailed)
			}
		})
	}
	chBody := strings.Replace(okBody, `}`, `,"channel":"\u0130os"}`, 1)
	if _, err := ParseCommand([]byte(chBody), ""); idem.ErrorCode(err) != idem.ECodeValidationFailed {
		t.Errorf("channel with a dotted capital I: %v", err)
	}
	c := mustParse(t, with("merchantReference", "caf\u00e9"), "")
	if c.MerchantReference != "caf\u00e9" {
		t.Errorf("NFC reference stored as %q", c.MerchantReference)
	}
}

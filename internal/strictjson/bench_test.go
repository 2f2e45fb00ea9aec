package strictjson

import "testing"

// BenchmarkDecodeObject decodes a create_payment body into its wire struct
// under the package's rules (duplicate names, invalid UTF-8, unknown members
// and trailing data rejected).
func BenchmarkDecodeObject(b *testing.B) {
	body := []byte(`{"accountId":"acc_1","amount":"10.50","currency":"EUR","merchantReference":"invoice-7781","channel":"api"}`)
	var dst struct {
		AccountID         string `json:"accountId"`
		Amount            string `json:"amount"`
		Currency          string `json:"currency"`
		MerchantReference string `json:"merchantReference"`
		Channel           string `json:"channel"`
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := DecodeObject(body, &dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkObject is the structural check alone.
func BenchmarkObject(b *testing.B) {
	body := []byte(`{"accountId":"acc_1","amount":"10.50","currency":"EUR","merchantReference":"invoice-7781","channel":"api"}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Object(body); err != nil {
			b.Fatal(err)
		}
	}
}

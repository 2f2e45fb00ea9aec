package fingerprint

import "testing"

// paymentFields is a create_payment command as payments.Command.fields
// normalises it.
func paymentFields() map[string]any {
	return map[string]any{
		"apiVersion": "2026-01-01", "accountId": "acc_1", "amountMinor": int64(1050), "currency": "EUR",
		"merchantReference": "invoice-7781", "channel": "api",
	}
}

// BenchmarkHash is the current version (2): RFC 8785 canonical form of the
// command plus SHA-256.
func BenchmarkHash(b *testing.B) {
	fields := paymentFields()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Hash("create_payment", fields); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHashes is what every request computes: the hash under every
// supported version.
func BenchmarkHashes(b *testing.B) {
	fields := paymentFields()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Hashes("create_payment", fields); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawHash is what a request computes before anything else: the
// raw hash of a payment's body under its Api-Version.
func BenchmarkRawHash(b *testing.B) {
	body := []byte(`{"accountId":"acc_1","amount":"10.50","currency":"EUR","merchantReference":"invoice-7781","channel":"api"}`)
	b.ReportAllocs()
	for b.Loop() {
		RawHash("create_payment", body, "Api-Version", "2026-01-01")
	}
}

package payments

import (
	"context"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

var benchBody = []byte(`{"accountId":"acc_1","amount":"10.50","currency":"EUR","merchantReference":"invoice-7781"}`)

// BenchmarkParseCommand: strict decode, validation and normalisation of a
// POST /payments body.
func BenchmarkParseCommand(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseCommand(benchBody, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprint: the request hash under every supported version.
func BenchmarkFingerprint(b *testing.B) {
	cmd, err := ParseCommand(benchBody, "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cmd.Fingerprint(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchPayment() Payment {
	id := PaymentID("tenant-a", "acc_1", "invoice-7781")
	return Payment{Tenant: "tenant-a", ID: id, AccountID: "acc_1", AmountMinor: 1050, Currency: "EUR",
		MerchantReference: "invoice-7781", Channel: "api", Status: "PENDING", ProviderKey: ProviderKey(id),
		CreatedAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

// BenchmarkRender renders a payment's response body in each schema.
func BenchmarkRender(b *testing.B) {
	p := benchPayment()
	for _, schema := range []string{"v2", "v3"} {
		b.Run(schema, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := renderers[schema](p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCompletion is the whole 201 answer of a new payment: body,
// headers and record metadata (v2 reads nothing from the store).
func BenchmarkCompletion(b *testing.B) {
	svc := NewService(nil, Config{})
	p := benchPayment()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.completion(ctx, nil, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateClientSide is Create's work outside the store for a new
// key: parse, fingerprint, payment identity and event, and the 201 answer.
func BenchmarkCreateClientSide(b *testing.B) {
	svc := NewService(nil, Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		cmd, err := ParseCommand(benchBody, "")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := cmd.Fingerprint(); err != nil {
			b.Fatal(err)
		}
		p, _ := svc.newPayment(idemScope(), cmd)
		if _, err := svc.completion(ctx, nil, p); err != nil {
			b.Fatal(err)
		}
	}
}

func idemScope() idem.Scope { return idem.Scope{Tenant: "tenant-a", Operation: Operation, Key: "k1"} }

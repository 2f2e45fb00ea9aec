package payments

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files of the response schemas")

// TestCreatedGolden pins the 201 answer of each response schema, byte for
// byte, for one payment. A referencing record stores no body: its replay
// renders the answer again from the payment (created), so a change to a
// schema's rendering would change what replays of records written under it
// return. A schema without a golden file fails here; a new schema gets its
// own file (go test ./payments -run TestCreatedGolden -update) and keeps it.
func TestCreatedGolden(t *testing.T) {
	p := Payment{
		Tenant: "tenant-a", ID: "pay_0123456789abcdef01234567", AccountID: "acc_1", AmountMinor: 1000,
		Currency: "EUR", MerchantReference: "invoice-7781", Channel: "api",
		// The payment has moved on since: the answer to its creation
		// still shows it as created.
		Status: "CONFIRMED", ProviderKey: ProviderKey("pay_0123456789abcdef01234567"),
		CreatedAt: time.Date(2026, 11, 30, 9, 15, 42, 123456000, time.FixedZone("CET", 3600)),
	}
	schemas := make([]string, 0, len(renderers))
	for s := range renderers {
		schemas = append(schemas, s)
	}
	slices.Sort(schemas)
	for _, schema := range schemas {
		t.Run(schema, func(t *testing.T) {
			resp, err := created(schema, p)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != 201 || resp.SchemaVersion != schema || resp.Headers["Content-Type"] != "application/json" ||
				resp.Headers["Location"] != "/payments/"+p.ID || len(resp.Headers) != 2 {
				t.Errorf("answer = %d %s %v, want 201 in %s with Content-Type and Location", resp.Status, resp.SchemaVersion, resp.Headers, schema)
			}
			golden := filepath.Join("testdata", "created_"+schema+".json")
			if *update {
				if err := os.WriteFile(golden, append(resp.Body, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("schema %s has no golden answer: %v", schema, err)
			}
			if !bytes.Equal(resp.Body, bytes.TrimSuffix(want, []byte("\n"))) {
				t.Errorf("schema %s renders\n%s\nwant (%s)\n%s", schema, resp.Body, golden, want)
			}
		})
	}
}

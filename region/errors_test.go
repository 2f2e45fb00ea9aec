package region

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/payments"
)

// TestErrorTableMatchesREADME: every code the README documents maps to the
// documented status, and every code in the table is documented.
func TestErrorTableMatchesREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| (\\d{3}) \\|")
	documented := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		status, _ := strconv.Atoi(m[2])
		documented[m[1]] = status
	}
	if len(documented) < 10 {
		t.Fatalf("found only %d error rows in the README", len(documented))
	}
	for code, status := range documented {
		if got, ok := codeStatus[code]; !ok || got != status {
			t.Errorf("README: %s is %d; code table: %d (present %v)", code, status, got, ok)
		}
	}
	for code := range codeStatus {
		if _, ok := documented[code]; !ok {
			t.Errorf("code %s is not documented in the README's error table", code)
		}
	}
}

// TestStatusTableCoversPaymentsCodes: every code the payments operation
// answers with has a status in the one table (the codes live in package
// payments, not in the engine's vocabulary).
func TestStatusTableCoversPaymentsCodes(t *testing.T) {
	for _, code := range payments.Codes {
		if _, ok := codeStatus[code]; !ok {
			t.Errorf("payments code %s has no status in the table", code)
		}
	}
	if codeStatus[payments.ECodeOutcomeUnknown] != 202 || codeStatus[idem.ECodeOutcomeUnknown] != 202 {
		t.Errorf("outcome unknown codes: payments %d, engine %d; want 202 for both",
			codeStatus[payments.ECodeOutcomeUnknown], codeStatus[idem.ECodeOutcomeUnknown])
	}
}

package region

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/payments"
)

// testErrors is the table of a node serving payments.
func testErrors(t testing.TB) *idemhttp.Errors {
	t.Helper()
	table, err := nodeErrors([]Operation{{Name: payments.Operation, Errors: payments.Errors}})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// TestErrorTableMatchesDocs: docs/errors.md has a section for every code
// of the node's table (the anchor its problem type URI points at) with the
// code's status and Retry-After, and no section for a code the table
// lacks.
func TestErrorTableMatchesDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile(`(?m)^## ([A-Z0-9_]+)\n\n\*\*(\d{3})\*\* · (no Retry-After|Retry-After: (\d+))$`)
	table := testErrors(t)
	documented := map[string]bool{}
	for _, m := range section.FindAllStringSubmatch(string(doc), -1) {
		code := m[1]
		documented[code] = true
		status, _ := strconv.Atoi(m[2])
		retry, _ := strconv.Atoi(m[4])
		c := table.Class(code)
		if table.TypeURI(code) != idemhttp.DefaultTypeBase+lowerCode(code) || (code != idem.ECodeInternal && c == table.Class(idem.ECodeInternal)) {
			t.Errorf("docs/errors.md documents %s, which the table does not have", code)
			continue
		}
		if c.Status != status || c.RetryAfter != retry {
			t.Errorf("docs/errors.md: %s is %d, Retry-After %d; the table says %d, %d", code, status, retry, c.Status, c.RetryAfter)
		}
	}
	for _, code := range table.Codes() {
		if !documented[code] {
			t.Errorf("code %s has no section in docs/errors.md (its type URI's anchor)", code)
		}
	}
}

func lowerCode(code string) string {
	b := []byte(code)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// TestPaymentsCodesInTheTable: the payments operation's codes are in the
// node's table because the operation declares them, not because the node
// knows payments.
func TestPaymentsCodesInTheTable(t *testing.T) {
	withPayments, without := testErrors(t), idemhttp.DefaultErrors()
	for code, class := range payments.Errors {
		if withPayments.Class(code) != class || without.Status(code) != 500 {
			t.Errorf("payments code %s: %+v with payments, %d without", code, withPayments.Class(code), without.Status(code))
		}
	}
	if withPayments.Status(payments.ECodeOutcomeUnknown) != 202 || withPayments.Status(idem.ECodeOutcomeUnknown) != 202 {
		t.Errorf("outcome unknown codes: payments %d, engine %d; want 202 for both",
			withPayments.Status(payments.ECodeOutcomeUnknown), withPayments.Status(idem.ECodeOutcomeUnknown))
	}
}

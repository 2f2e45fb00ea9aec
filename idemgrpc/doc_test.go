package idemgrpc_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/idemhttp"
)

// TestDocumentedCodes checks docs/grpc.md's table of error codes against
// the code: each row's gRPC code and RetryInfo are what the interceptor
// answers, and every contract code the interceptor answers has a row.
func TestDocumentedCodes(t *testing.T) {
	doc, err := os.ReadFile("../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	table := idemhttp.DefaultErrors()
	rows := 0
	seen := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) != 6 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		code := strings.Trim(strings.TrimSpace(cells[1]), "`")
		grpcCode := strings.Trim(strings.TrimSpace(cells[2]), "`")
		retry := strings.TrimSpace(cells[3])
		if grpcCode == "" || strings.Contains(code, " ") {
			continue
		}
		rows++
		seen[code] = true
		if got := idemgrpc.CodeName(idemgrpc.Code(table, code)); got != grpcCode {
			t.Errorf("%s: documented %s, answers %s", code, grpcCode, got)
		}
		wantRetry := ""
		if ra := table.Class(code).RetryAfter; ra > 0 {
			wantRetry = fmt.Sprintf("%d s", ra)
		}
		if retry != wantRetry {
			t.Errorf("%s: documented RetryInfo %q, answers %q", code, retry, wantRetry)
		}
	}
	if rows < 10 {
		t.Fatalf("found %d rows in docs/grpc.md's table of codes: the table's layout changed", rows)
	}
	for _, code := range []string{"IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_INVALID", "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST",
		"IDEMPOTENCY_REQUEST_IN_PROGRESS", "OUTCOME_UNKNOWN", "UNAUTHENTICATED", "METHOD_NOT_ALLOWED"} {
		if !seen[code] {
			t.Errorf("docs/grpc.md does not document %s", code)
		}
	}
}

package region

import (
	"os"
	"regexp"
	"strconv"
	"testing"
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

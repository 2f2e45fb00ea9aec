package idemhttp

import (
	"testing"

	"github.com/idemcoord/idem/region"
)

// TestStatusesMatchRegion keeps this package's statuses equal to the one
// table in package region.
func TestStatusesMatchRegion(t *testing.T) {
	for code, status := range statuses {
		if want := region.StatusOf(code); status != want {
			t.Errorf("StatusOf(%s) = %d, region says %d", code, status, want)
		}
	}
}

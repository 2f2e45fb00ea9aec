package idemhttp_test

import (
	"testing"

	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/region"
)

// TestStatusesMatchRegion keeps this package's statuses equal to the one
// table in package region.
func TestStatusesMatchRegion(t *testing.T) {
	for code, status := range idemhttp.Statuses {
		if want := region.StatusOf(code); status != want {
			t.Errorf("StatusOf(%s) = %d, region says %d", code, status, want)
		}
	}
	if len(idemhttp.Statuses) == 0 {
		t.Error("no statuses")
	}
}

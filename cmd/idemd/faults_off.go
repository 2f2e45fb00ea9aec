//go:build !failpoints

package main

import (
	"flag"
	"time"

	"github.com/idemcoord/idem/payments"
)

// faults: a release build has no fault injection. --break,
// --duplicate-delivery, IDEM_FAILPOINTS and IDEM_CLOCK_SKEW exist only in a
// build with -tags failpoints (faults_on.go).
type faults struct{}

func (*faults) register(*flag.FlagSet, *bool) {}

func (*faults) parse(func(string) string) error { return nil }

func (*faults) payments() payments.Faults { return payments.Faults{} }

// now is the node's wall clock. Record times never come from it (they are
// the store's now()); it only measures the node's own windows, such as the
// uncertainty after a failover.
func (*faults) now() time.Time { return time.Now() }

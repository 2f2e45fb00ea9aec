//go:build failpoints

package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/idemcoord/idem/internal/failpoint"
	"github.com/idemcoord/idem/payments"
)

// faults are the fault-injection settings of a build with -tags failpoints,
// for the chaos harness and the tests of its faults. A release build has
// none of them (faults_off.go).
type faults struct {
	// failpoints pause the node at named points (IDEM_FAILPOINTS).
	failpoints *failpoint.Set
	// brk selects a deliberately broken engine (--break).
	brk string
	// clockSkew offsets this node's wall clock (IDEM_CLOCK_SKEW).
	clockSkew time.Duration
}

// register defines the fault-injection flags; --duplicate-delivery sets
// *duplicateDelivery.
func (f *faults) register(fs *flag.FlagSet, duplicateDelivery *bool) {
	fs.StringVar(&f.brk, "break", "", "run a deliberately broken engine so a chaos run must fail: find-then-insert, no-fencing or raw-body-hash (built with -tags failpoints; never in production)")
	fs.BoolVar(duplicateDelivery, "duplicate-delivery", false, "deliver every outbox event twice (fault injection; built with -tags failpoints)")
}

// parse reads IDEM_FAILPOINTS and IDEM_CLOCK_SKEW.
func (f *faults) parse(getenv func(string) string) error {
	var err error
	if f.failpoints, err = failpoint.Parse(getenv("IDEM_FAILPOINTS")); err != nil {
		return err
	}
	if skew := getenv("IDEM_CLOCK_SKEW"); skew != "" {
		if f.clockSkew, err = time.ParseDuration(skew); err != nil {
			return fmt.Errorf("IDEM_CLOCK_SKEW: %w", err)
		}
	}
	return nil
}

// payments are the payment service's failpoints and broken mode.
func (f *faults) payments() payments.Faults {
	return payments.Faults{Failpoints: f.failpoints, Break: f.brk}
}

// now is the node's wall clock, offset by IDEM_CLOCK_SKEW. Record times never
// come from it (they are the store's now()); it only measures the node's own
// windows, such as the uncertainty after a failover.
func (f *faults) now() time.Time { return time.Now().Add(f.clockSkew) }

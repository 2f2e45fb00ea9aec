//go:build !failpoints

package payments

import (
	"context"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// Faults are the fault-injection settings of a Service: failpoints and the
// deliberately broken engines. A release build (without -tags failpoints)
// has none; every hook below is a no-op the compiler removes.
type Faults struct{}

func (Faults) validate() error { return nil }

func (s *Service) failpoint(context.Context, string) {}

func (s *Service) requestHashes(_ []byte, hashes []string) []string { return hashes }

func (s *Service) externalFencing() bool { return s.cfg.Locker != nil }

func (c *createCall) claimFunc() engine.ClaimFunc { return c.claim }

func (s *Service) unfenced(l idem.Lease) idem.Lease { return l }

package payments

import "github.com/idemcoord/idem/engine"

// Parsed reports whether the call parsed its command.
func (c *Call) Parsed() bool { return c.parsed }

// Request is the engine request of the call for req.
func (c *Call) Request(req Request) engine.Request { return c.request(req) }

// ClaimsQueued reports how many of s's claims wait for a batch.
func ClaimsQueued(s *Service) int { return s.claims.Queued() }

// ClaimBatchesInFlight reports how many of s's claim batches are in flight.
func ClaimBatchesInFlight(s *Service) int { return s.claims.InFlight() }

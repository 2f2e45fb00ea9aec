package idemhttp

import "github.com/idemcoord/idem"

// Metrics counts what the middleware answers. Package idemprom implements
// it (and sidecar.Metrics) with Prometheus counters registered on a
// prometheus.Registerer; a program that exports its metrics another way
// implements it itself. idemhttp imports no metrics library, so a program
// that imports it links none.
type Metrics interface {
	// Requests is called once by Middleware with its operation and
	// returns what counts that operation's requests by outcome (one of
	// Outcomes()), once per request, concurrently. It may create each
	// outcome's series then, so that they exist before the first request.
	Requests(operation string) func(outcome string)
}

// Outcomes returns the outcomes Metrics counts requests by
// (idem.OutcomeLabels): the engine's outcome for a request it answered,
// "rejected" for a request refused before it (no key, a bad key, a body too
// large, an unknown tenant), "error" for an answer the engine could not
// give.
func Outcomes() []string { return idem.OutcomeLabels() }

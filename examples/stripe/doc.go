// Package stripeexample is the proof that idemd's sidecar works with a real
// payment SDK: the official Stripe Go SDK (stripe-go), whose requests are
// form-encoded under /v1/ and which has its own retry loop and its own
// Idempotency-Key, talks to an idemd node as if it were Stripe's API, and
// the node proxies POST /v1/charges to a Stripe-like upstream (package
// fakestripe, command upstream).
//
// The tests of this package start a real local cluster (idemctl up, three
// regions) and drive it with the SDK; README.md is the walkthrough, with
// what the SDK's retry loop does and does not retry. This is a module of
// its own (examples/stripe/go.mod), so that stripe-go never enters the
// main module's build list.
package stripeexample

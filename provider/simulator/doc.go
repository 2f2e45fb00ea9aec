// Package simulator is a payment provider simulator: a real HTTP server
// (see [Server], [Serve] and [ListenAndServe]) that speaks the API of package
// [github.com/idemcoord/idem/provider], used by tests, by a local cluster
// (idemctl provider) and by the chaos harness, whose failure modes can be
// switched on at run time so that tests can break it deliberately. It is the
// one place in the project where a fake is allowed, and idemd does not link
// it.
//
// With [Config.APIKey] set, the /v1 endpoints need "Authorization: Bearer
// <APIKey>", and with [Config.AdminKey] the /admin endpoints need the admin
// key the same way (each refuses the other's). Charges, declines and
// fencing tokens persist in [Config.DataDir].
//
// # Faults
//
// While a fault is active every well-formed charge request consumes one unit
// of its Times budget (0 means "until changed"):
//
//   - fail: 503 PROVIDER_UNAVAILABLE, nothing charged, nothing remembered.
//   - decline: a new key is declined with 402 PAYMENT_DECLINED and stays
//     declined (persisted) even after the fault is cleared. A key that already
//     charged is replayed instead.
//   - slow: the request waits Delay before being processed. If the client goes
//     away first, the charge is still applied when the delay ends; the client
//     just never sees the answer.
//   - lose-answer: the request is processed and persisted, then the connection
//     is closed without an answer.
package simulator

// Package provider is a payment provider simulator and a small HTTP client
// for it.
//
// The reference operation of the idempotency coordination service, POST
// /payments, calls a downstream payment provider. This package plays that
// provider: a real HTTP server (see [Server], [Serve] and [ListenAndServe])
// used by tests and by a local cluster, whose failure modes can be switched on
// at run time so that tests can break it deliberately. It is the one place in
// the project where a fake is allowed.
//
// # HTTP API
//
// All bodies are JSON; errors are {"errorCode":"...","message":"..."}.
// With [Config.APIKey] set, the /v1 endpoints need "Authorization: Bearer
// <APIKey>", and with [Config.AdminKey] the /admin endpoints need the admin
// key the same way (each refuses the other's); a missing or wrong key
// answers 401 UNAUTHENTICATED before anything else happens. idemctl
// provider requires both keys, read from files or environment variables.
//
//   - POST /v1/charges with header Idempotency-Key: provider_payment_<paymentId>
//     (required) and optional Idem-Fencing-Token: <int64>; body
//     {"amountMinor":1000,"currency":"EUR","accountId":"acc_1"}. The first
//     request for a key charges and answers 201 with the charge; a repeat
//     answers 200 with the same body and Idempotent-Replayed: true. A repeat
//     with a different amount or currency answers 409 PROVIDER_KEY_REUSED. A
//     fencing token lower than the highest one seen for the key answers 409
//     FENCING_TOKEN_STALE and changes nothing.
//   - GET /v1/charges/{providerKey} answers 200 with the charge or 404
//     CHARGE_NOT_FOUND when the key never charged (declined keys included).
//   - PUT /admin/fault and GET /admin/fault set and read the active [Fault].
//   - GET /admin/charges answers [ChargeCounts]: how many charges were
//     actually applied, in total and per key.
//   - GET /healthz answers 200.
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
//
// # Errors
//
// [Client] classifies failures with sentinel errors usable with errors.Is.
// The distinction that matters most is between [ErrUnavailable] (the provider
// answered 5xx or the request never left the client: definitely nothing was
// charged) and [ErrAmbiguous] (the request was sent but no usable answer came
// back: it may or may not have been applied, so the caller must reconcile,
// for example with [Client.Lookup], or retry with the same key).
package provider

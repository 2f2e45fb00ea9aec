// Package provider is the HTTP client of the payment provider and the wire
// types of its API.
//
// The reference operation of the idempotency coordination service, POST
// /payments, calls a downstream payment provider through [Client]. The
// provider simulator that plays it in tests, local clusters and chaos runs
// is package [github.com/idemcoord/idem/provider/simulator], which idemd
// does not link.
//
// # HTTP API
//
// All bodies are JSON; errors are {"errorCode":"...","message":"..."}.
// A provider with an API key needs "Authorization: Bearer <APIKey>" on the
// /v1 endpoints, and one with an admin key needs it the same way on the
// /admin endpoints (each refuses the other's); a missing or wrong key
// answers 401 UNAUTHENTICATED before anything else happens. idemctl
// provider requires both keys, read from files or environment variables.
//
//   - POST /v1/charges with header Idempotency-Key: provider_payment_<paymentId>
//     (required) and optional Idem-Fencing-Token: <int64>; body
//     {"amountMinor":1000,"currency":"EUR","accountId":"acc_1"}, with an
//     optional "reference" (the caller's, kept with the charge and returned
//     with it: letters, digits, '_' and '-', at most 64). The first
//     request for a key charges and answers 201 with the charge; a repeat
//     answers 200 with the same body (the first request's reference
//     included) and Idempotent-Replayed: true. A repeat
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
// # Errors
//
// [Client] classifies failures with sentinel errors usable with errors.Is.
// The distinction that matters most is between [ErrUnavailable] (the provider
// answered 5xx or the request never left the client: definitely nothing was
// charged) and [ErrAmbiguous] (the request was sent but no usable answer came
// back: it may or may not have been applied, so the caller must reconcile,
// for example with [Client.Lookup], or retry with the same key).
package provider

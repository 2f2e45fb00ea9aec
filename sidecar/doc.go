// Package sidecar puts idempotency in front of an existing HTTP service, in
// any language, with no change to the service: chosen routes ([Route],
// parsed from idemd's --proxy-routes by [ParseRoutes]) run through the
// engine (package engine, via package idemhttp's middleware) and are proxied
// to the service, the upstream.
//
// A request of a route needs an Idempotency-Key and an authenticated tenant.
// Its fingerprint is its method, path, query (decoded and sorted), body
// (one strict JSON object, package strictjson's rules; empty is null) and
// the route's semantic headers (Api-Version and Route.Headers). The upstream
// receives the same method, path, query and body, with
//
//   - Idempotency-Key: the derived key ([DerivedKey]), stable for the
//     tenant, operation, client key and record generation, the same in
//     every region, and never the same for two tenants;
//   - Idem-Tenant: the tenant; Idem-Fencing-Token: the attempt's fencing
//     token (it only grows for a key, so the upstream may reject a smaller
//     one);
//   - not the client's Authorization, its own Idem-* headers, or hop-by-hop
//     headers.
//
// The upstream's answer decides the record (idemhttp.DefaultClass): 2xx and
// 3xx are COMPLETED and 4xx other than 408, 409, 425 and 429 are
// FAILED_REPLAYABLE, both stored and replayed byte for byte with
// Idempotent-Replayed: true; 408, 409, 425, 429 and 5xx are FAILED_RETRYABLE:
// answered but not stored, so the next retry executes again, with the same
// derived key. An upstream that could not be reached before the request was
// written answers 503 UNAVAILABLE (retryable). An answer lost after the
// request was (maybe) written - a timeout, a reset connection, a body cut
// short - is UNKNOWN_REQUIRES_RECOVERY: the client gets 202
// PAYMENT_OUTCOME_UNKNOWN, and the record is settled by the route's Lookup,
// or by sending the request again when the route declares the upstream
// idempotent on the key (Route.IdempotentUpstream), or else stays UNKNOWN for
// an operator (metric idem_sidecar_upstream_calls_total{result="unknown"},
// the record's state at GET /v1/idempotency/records/{operation}/{key}); it
// is never executed again silently.
//
// Connections to the upstream are never reused: net/http's transport
// resends a request carrying Idempotency-Key on a reused connection that
// failed, which would be a silent second execution.
package sidecar

// Package sidecar puts idempotency in front of an existing HTTP service, in
// any language, with no change to the service: chosen routes ([Route],
// parsed from idemd's --proxy-routes by [ParseRoutes]) run through the
// engine (package engine, via package idemhttp's middleware) and are proxied
// to the service, the upstream.
//
// A request of a route needs an idempotency key and an authenticated
// tenant. The key is the Idempotency-Key header, bare or in the IETF
// draft's sf-string form ("8e03978e-..."; idemhttp.KeyFromHeader), or a
// body field the route names (Route.KeyField). Its fingerprint is its
// method, path, query (decoded and sorted), the route's semantic headers
// (Api-Version and Route.SemanticHeaders) and its body, by media type:
//
//   - JSON (application/json, any +json type, or no Content-Type): one
//     strict JSON object (package strictjson's rules, numbers exact; empty
//     is null);
//   - application/x-www-form-urlencoded: canonically
//     (fingerprint.ParseForm: decoded, pairs ordered by name, a repeated
//     name's values in the order sent), so that the same fields in another
//     order are the same command and any other difference is a conflict;
//   - anything else (XML, protobuf, multipart, octet-stream): its bytes,
//     with its media type.
//
// Fields a route ignores (Route.Ignore: request timestamps, envelope ids
// that change on every retry) and the key field are left out. The upstream
// receives the same method, path, query and body, with
//
//   - Idempotency-Key: the derived key ([DerivedKey]), stable for the
//     tenant, operation, client key and record generation, the same in
//     every region, and never the same for two tenants;
//   - Idem-Tenant: the tenant; Idem-Fencing-Token: the attempt's fencing
//     token (it only grows for a key, so the upstream may reject a smaller
//     one);
//   - not the client's Authorization (unless Route.PassAuthorization), its
//     own Idem-* headers, or hop-by-hop headers.
//
// The path goes to the upstream as it came, so a path that an upstream
// which decodes it could resolve outside the route ("/transfers/%2e%2e/admin")
// is refused with 400 REQUEST_PATH_INVALID ([CheckPath]), and a body that
// its Content-Length declares over Options.MaxBodyBytes with 413
// REQUEST_BODY_TOO_LARGE and no 100 Continue, both before anything is read,
// stored or sent on.
//
// The upstream's answer decides the record (idemhttp.DefaultClass): 2xx and
// 3xx are COMPLETED and 4xx other than 408, 409, 425 and 429 are
// FAILED_REPLAYABLE, both stored and replayed byte for byte with
// Idempotent-Replayed: true (with the headers DefaultReplayHeaders and
// Route.ReplayHeaders name; Set-Cookie only when named); 408, 409, 425,
// 429 and 5xx are FAILED_RETRYABLE:
// answered but not stored, so the next retry executes again, with the same
// derived key. An upstream that could not be reached before the request was
// written answers 503 SERVICE_UNAVAILABLE (retryable). An answer lost after the
// request was (maybe) written - a timeout, a reset connection, a body cut
// short - is UNKNOWN_REQUIRES_RECOVERY: the client gets 202
// OUTCOME_UNKNOWN, and the record is settled by the route's Lookup,
// or by sending the request again when the route declares the upstream
// idempotent on the key (Route.IdempotentUpstream), or else stays UNKNOWN for
// an operator (metric idem_sidecar_upstream_calls_total{result="unknown"},
// the record's state at GET /v1/idempotency/records/{operation}/{key}); it
// is never executed again silently.
//
// An answer larger than the route's max-response (Route.MaxResponse;
// default Options.MaxResponseBody, 1 MiB) and a stream (text/event-stream) are not held for the
// record: the client gets them as they arrive, flushed as read, and never
// more than max-response bytes of them is in memory. An answer without a
// Content-Length is read up to max-response first, so that a short one is
// stored and replayed as any other, and passed on from there when it is
// longer. The record of such an answer is settled by its status as above,
// but without its body: a retry answers 410
// IDEMPOTENCY_RESPONSE_NOT_STORED and is not executed again, and the
// record shows responseSchemaVersion "not-stored"
// (idemhttp.NotStoredSchema). One that breaks off while passed on is
// settled the same way (its status was received), and the client's
// connection is aborted so that it cannot take the part for the whole.
//
// A client that hangs up (its own timeout, a dropped connection) cancels
// nothing: the upstream call runs to its answer or to Route.Timeout,
// detached from the client, and the answer is stored for the client's
// retry. A retry that finds the call still in progress answers 409
// IDEMPOTENCY_REQUEST_IN_PROGRESS with Retry-After, or, with Prefer:
// wait=N or a route's Wait, is held until the answer is stored and gets it.
//
// Connections to the upstream are kept alive and reused, but a request is
// never sent twice: net/http's transport resends a request on a reused
// connection that failed when it can rewind the body, and takes a request
// with an Idempotency-Key and no body for one it may resend; the proxy
// gives every request a body it cannot rewind, so a failed connection is
// an unknown outcome, settled as above, never a silent second execution.
//
// A webhook route (Route.Webhook: WebhookStandard or WebhookStripe)
// receives signed events that their sender redelivers. Its deliveries
// carry no credentials of the node: the sender's signature, verified with
// the Standard Webhooks Go library or stripe-go's webhook package (with
// the route's secrets and the timestamp within Route.WebhookTolerance)
// before anything is stored, authenticates them, and the route names their
// tenant (Route.WebhookTenant). The key is the event's id (the webhook-id
// header, or a Stripe event's "id"); the signature headers, new on every
// delivery, are not part of the fingerprint, so a redelivery gets the
// first answer, within a window as long as the sender retries
// (DefaultWebhookWindow). A delivery that does not verify answers 401
// WEBHOOK_SIGNATURE_INVALID and stores nothing ([Proxy.VerifyWebhook],
// [WebhookMetrics]).
package sidecar

// Package idemgrpc makes unary gRPC methods idempotent with the engine of
// package engine, as package idemhttp does for HTTP handlers: a server
// interceptor over the engine, and a client interceptor that gives every
// logical call one key, kept across gRPC's own retries.
//
//	ic, err := idemgrpc.New(eng, idemgrpc.Options{
//		Tenant:  func(ctx context.Context) (string, error) { return tenantOf(ctx) },
//		Methods: map[string]idemgrpc.Method{"/payments.v1.Payments/Create": {Operation: "create_payment"}},
//	})
//	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
//
//	conn, err := grpc.NewClient(target, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})), ...)
//
// The contract is docs/grpc.md's, the same as the HTTP one in gRPC's terms:
//
//   - The key is the idempotency-key request metadata, one value, bare or
//     an RFC 8941 sf-string (idemhttp.ParseKey's rules); without it the call
//     answers INVALID_ARGUMENT IDEMPOTENCY_KEY_MISSING, with a bad one
//     INVALID_ARGUMENT IDEMPOTENCY_KEY_INVALID. The tenant comes from
//     Options.Tenant, a function of the call's context (its authenticated
//     peer or token), never from a client-chosen field.
//   - The command's fingerprint is the full method name and the request
//     message in deterministic proto encoding, re-encoded from the decoded
//     message without its unknown fields: the same message sent by another
//     language, with its fields in another order, is the same command.
//   - What is stored and replayed is the response message (its bytes and
//     its type's full name), or the final status with its code, message and
//     details; the header and trailer metadata named by Options.ReplayHeaders
//     and Options.ReplayTrailers. A replay carries idempotent-replayed: true
//     in its header metadata.
//   - A key in progress, reused with another command, missing or bad, or
//     whose outcome is not known yet answers a fixed gRPC code with the
//     contract's errorCode as the Reason of a google.rpc.ErrorInfo detail
//     (Domain ErrorDomain), and, where the same call may succeed later, a
//     google.rpc.RetryInfo detail and the grpc-retry-pushback-ms trailer
//     (see Code for the table). Those answers are trailers-only, so that a
//     client's retry policy may retry them.
//
// The handler runs with a context that carries the call's values but not
// its cancellation: a client that hangs up does not cut off a call it
// started, and the answer is stored for its retry (the context ends at the
// operation's lock timeout). How an answer is stored depends on its class,
// which the handler may set with [Classify]; by default ([DefaultClass]) a
// response is COMPLETED, a status whose code is a deterministic rejection
// (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED) is FAILED_REPLAYABLE
// (stored and replayed), and every other code is FAILED_RETRYABLE: sent
// to this client but not stored, so a retry executes again. A handler that
// may have acted before it failed says so with Classify
// (idem.StatusUnknown), and the operation's Recover settles the record.
//
// Streaming methods cannot keep the contract (a stream's answer is not one
// message to store), so [Interceptor.Stream] refuses a stream that carries
// an idempotency key, or whose method Options.Methods names, with
// UNIMPLEMENTED METHOD_NOT_ALLOWED, instead of running it unprotected.
//
// Nothing here registers anything globally: metrics go to Options.Metrics
// (idemprom.NewGRPC makes Prometheus counters), spans to
// Options.TracerProvider, logs to Options.Logger.
package idemgrpc

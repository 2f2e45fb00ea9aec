package idemgrpc

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

// ErrorDomain is the Domain of the google.rpc.ErrorInfo detail of every
// error the interceptors answer; its Reason is the error code.
const ErrorDomain = "idem.idemcoord.github.com"

// PushbackTrailer is the trailer by which a server tells a gRPC client's
// retry policy how long to wait before it retries (gRFC A6).
const PushbackTrailer = "grpc-retry-pushback-ms"

// contractCodes are the gRPC codes of the contract's error codes. They are
// part of the contract (docs/grpc.md): never change one.
var contractCodes = map[string]codes.Code{
	idem.ECodeKeyMissing:            codes.InvalidArgument,
	idem.ECodeKeyInvalid:            codes.InvalidArgument,
	idem.ECodeKeyReused:             codes.FailedPrecondition,
	idem.ECodeInProgress:            codes.Aborted,
	idem.ECodeOutcomeUnknown:        codes.Unavailable,
	idem.ECodeResponseNotStored:     codes.FailedPrecondition,
	idem.ECodeResponseTooLarge:      codes.Internal,
	idem.ECodeUnauthenticated:       codes.Unauthenticated,
	idem.ECodeRequestMalformed:      codes.InvalidArgument,
	idem.ECodeValidationFailed:      codes.InvalidArgument,
	idem.ECodeMethodNotAllowed:      codes.Unimplemented,
	idem.ECodeNotHome:               codes.Unavailable,
	idem.ECodeReconciliationPending: codes.Unavailable,
	idem.ECodeStoreUnavailable:      codes.Unavailable,
	idem.ECodeUnavailable:           codes.Unavailable,
	idem.ECodeRequestTimeout:        codes.DeadlineExceeded,
	idem.ECodeInternal:              codes.Internal,
}

// Code returns the gRPC code an error code answers with, for a code of
// table t (idemhttp.DefaultErrors() when nil). The contract's codes answer
// as docs/grpc.md lists (IDEMPOTENCY_KEY_MISSING and _INVALID
// INVALID_ARGUMENT, IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST
// FAILED_PRECONDITION, IDEMPOTENCY_REQUEST_IN_PROGRESS ABORTED,
// OUTCOME_UNKNOWN UNAVAILABLE, ...); an operation's own code answers by the
// HTTP status t gives it (409 ABORTED, 503 UNAVAILABLE, a 2xx such as an
// unknown outcome's 202 UNAVAILABLE, as gRPC's HTTP mapping does
// otherwise). A code t does not know answers INTERNAL.
func Code(t *idemhttp.Errors, code string) codes.Code {
	if c, ok := contractCodes[code]; ok {
		return c
	}
	if t == nil {
		t = idemhttp.DefaultErrors()
	}
	known := false
	for _, c := range t.Codes() {
		if c == code {
			known = true
			break
		}
	}
	if !known {
		return codes.Internal
	}
	return codeOfHTTP(t.Status(code))
}

// codeOfHTTP maps an error's HTTP status to a gRPC code.
func codeOfHTTP(s int) codes.Code {
	switch {
	case s < 300:
		// A status that is not an answer yet (202 Accepted).
		return codes.Unavailable
	case s == http.StatusUnauthorized:
		return codes.Unauthenticated
	case s == http.StatusForbidden:
		return codes.PermissionDenied
	case s == http.StatusNotFound:
		return codes.NotFound
	case s == http.StatusConflict:
		return codes.Aborted
	case s == http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case s == http.StatusRequestTimeout, s == http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case s == http.StatusGone, s == http.StatusPreconditionFailed:
		return codes.FailedPrecondition
	case s == http.StatusNotImplemented:
		return codes.Unimplemented
	case s == http.StatusServiceUnavailable, s == http.StatusBadGateway:
		return codes.Unavailable
	case s < 500:
		return codes.InvalidArgument
	}
	return codes.Internal
}

// errorStatus is the gRPC status that answers err, and the trailer that
// goes with it (the retry pushback). As idemhttp.Errors.Write does: the
// message is the one err carries for clients; INTERNAL (and any code t does
// not know) says "Internal error." and is logged with its cause; an error
// that is the call's own cancellation answers as gRPC answers it.
func errorStatus(ctx context.Context, t *idemhttp.Errors, logger *slog.Logger, method string, err error) (*status.Status, metadata.MD) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		logger.DebugContext(ctx, "client went away", "method", method, "err", err)
		return status.FromContextError(ctx.Err()), nil
	}
	code := idem.ErrorCode(err)
	msg := idem.ErrorMessage(err)
	known := false
	for _, c := range t.Codes() {
		if c == code {
			known = true
			break
		}
	}
	if !known || code == idem.ECodeInternal {
		code, msg = idem.ECodeInternal, "Internal error."
	}
	class := t.Class(code)
	if class.Status >= 500 {
		logger.ErrorContext(ctx, "call failed", "method", method, "code", code, "err", err)
	}
	return codeStatus(t, code, msg)
}

// codeStatus is the status of error code with msg: its gRPC code, an
// ErrorInfo detail and, when its class has a Retry-After, a RetryInfo
// detail and the pushback trailer.
func codeStatus(t *idemhttp.Errors, code, msg string) (*status.Status, metadata.MD) {
	class := t.Class(code)
	st := status.New(Code(t, code), msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: code, Domain: ErrorDomain}}
	var trailer metadata.MD
	if class.RetryAfter > 0 {
		delay := time.Duration(class.RetryAfter) * time.Second
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		trailer = metadata.Pairs(PushbackTrailer, strconv.FormatInt(delay.Milliseconds(), 10))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st, trailer
}

// answerError sends st's trailer (if any) and returns st as the call's
// error.
func answerError(ctx context.Context, st *status.Status, trailer metadata.MD) error {
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	return st.Err()
}

// ErrorCode returns the contract's error code of a gRPC error answered by
// the interceptors (the Reason of its google.rpc.ErrorInfo detail of
// Domain ErrorDomain), or "" for an error that has none (a handler's own
// status, or a transport error).
func ErrorCode(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

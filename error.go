package idem

import (
	"errors"
	"fmt"
)

// Error codes a client can see, those of the engine and the node. They are
// part of the API contract: never rename one. An operation's own codes live
// in its own package. The HTTP status and
// Retry-After of each live in one table, idemhttp.DefaultErrors, which a
// node extends with the codes its operations declare.
const (
	// Idempotency contract.
	ECodeKeyMissing        = "IDEMPOTENCY_KEY_MISSING"
	ECodeKeyInvalid        = "IDEMPOTENCY_KEY_INVALID"
	ECodeKeyReused         = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"
	ECodeInProgress        = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	ECodeRecordNotFound    = "IDEMPOTENCY_RECORD_NOT_FOUND"
	ECodeFencingTokenStale = "FENCING_TOKEN_STALE"
	// ECodeOutcomeUnknown: an operation may have acted but its outcome was
	// lost and is not known yet; a retry with the same key answers it once
	// recovery knows. An operation may answer with its own code instead
	// (engine.Operation.UnknownCode).
	ECodeOutcomeUnknown        = "OUTCOME_UNKNOWN"
	ECodeRoutingLoop           = "IDEMPOTENCY_ROUTING_LOOP"
	ECodeNotHome               = "TENANT_NOT_SERVED_HERE"
	ECodeReconciliationPending = "IDEMPOTENCY_RECONCILIATION_PENDING"
	ECodeUnauthenticated       = "UNAUTHENTICATED"
	// ECodeForwardingNotAuthenticated: a request claims to be forwarded by
	// a node (Idem-Forwarded-By) but does not come from an authenticated
	// peer of the cluster.
	ECodeForwardingNotAuthenticated = "FORWARDING_NOT_AUTHENTICATED"
	ECodeRequestMalformed           = "REQUEST_MALFORMED"
	ECodeValidationFailed           = "REQUEST_VALIDATION_FAILED"
	ECodeBodyTooLarge               = "REQUEST_BODY_TOO_LARGE"
	ECodeUnsupportedMediaType       = "UNSUPPORTED_MEDIA_TYPE"
	ECodeAPIVersionUnsupported      = "API_VERSION_UNSUPPORTED"
	ECodeNotFound                   = "NOT_FOUND"
	ECodeMethodNotAllowed           = "METHOD_NOT_ALLOWED"
	ECodeOperationUnknown           = "OPERATION_UNKNOWN"
	ECodeRequestTimeout             = "REQUEST_TIMEOUT"
	// ECodePathInvalid: a sidecar route's request path that an upstream
	// could resolve outside the route (a dot segment, or an encoded '/' or
	// '\', as sent or decoded once or more); nothing is stored or sent on.
	ECodePathInvalid = "REQUEST_PATH_INVALID"
	// ECodeResponseTooLarge: an operation's answer is larger than the
	// idempotency layer may store; the first request's outcome cannot be
	// replayed, so it is not answered as a success.
	ECodeResponseTooLarge = "IDEMPOTENCY_RESPONSE_TOO_LARGE"
	// ECodeResponseNotStored: the first answer to a key was passed to its
	// client once without being stored (a stream, or an answer larger than
	// may be stored), and the record settled without it: a retry cannot be
	// answered with it and is not executed again. It answers 410 Gone, with
	// no Retry-After: the answer existed and is gone for good, and the same
	// key never brings it back. Not 409, which clients (and their SDKs) read
	// as "in progress, retry"; not 422, which would blame a request that was
	// fine; not 5xx, since nothing failed.
	ECodeResponseNotStored = "IDEMPOTENCY_RESPONSE_NOT_STORED"
	// ECodeRecordNotStuck: an operator asked to settle a record by hand
	// that is not stuck: it is settled already, or IN_PROGRESS under a
	// lock that has not run out (its owner may be working on it). Only an
	// UNKNOWN_REQUIRES_RECOVERY record, or an IN_PROGRESS one whose lock
	// has run out, is settled by hand.
	ECodeRecordNotStuck = "IDEMPOTENCY_RECORD_NOT_STUCK"
	// ECodeWebhookSignatureInvalid: a delivery to a sidecar webhook route
	// whose signature is missing, does not verify with the route's
	// secrets, or was made at a time outside the route's tolerance; it
	// is refused before anything is stored or sent on.
	ECodeWebhookSignatureInvalid = "WEBHOOK_SIGNATURE_INVALID"

	// Infrastructure.
	ECodeStoreUnavailable = "STORE_UNAVAILABLE"
	ECodeUnavailable      = "SERVICE_UNAVAILABLE"
	ECodeInternal         = "INTERNAL"
)

// Error is an error a client may see: a stable machine-readable Code and a
// human-readable Message. Internal details never go into Message; they are
// wrapped in Err and logged.
type Error struct {
	Code    string
	Message string
	// Err is the underlying cause, if any. It is logged, never sent.
	Err error
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, &idem.Error{Code: idem.ECodeKeyReused}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// ErrorCode returns the code of the first *Error in err's chain, ECodeInternal
// for any other non-nil error, and "" for nil.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ECodeInternal
}

// ErrorMessage returns the client-safe message of err: the message of the
// first *Error in its chain, or a generic text for anything else.
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "Internal error."
}

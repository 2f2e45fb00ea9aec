package region

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/payments"
)

// codeStatus maps every client-visible error code to its HTTP status, the
// engine's and node's (package idem) and the payments operation's (package
// payments). It is the one table; the README lists the same codes.
var codeStatus = map[string]int{
	idem.ECodeKeyMissing:                 http.StatusBadRequest,
	idem.ECodeKeyInvalid:                 http.StatusBadRequest,
	idem.ECodeKeyReused:                  http.StatusConflict,
	idem.ECodeInProgress:                 http.StatusConflict,
	idem.ECodeRecordNotFound:             http.StatusNotFound,
	idem.ECodeFencingTokenStale:          http.StatusConflict,
	idem.ECodeOutcomeUnknown:             http.StatusAccepted,
	idem.ECodeRoutingLoop:                http.StatusLoopDetected,
	idem.ECodeNotHome:                    http.StatusServiceUnavailable,
	idem.ECodeReconciliationPending:      http.StatusServiceUnavailable,
	idem.ECodeUnauthenticated:            http.StatusUnauthorized,
	idem.ECodeForwardingNotAuthenticated: http.StatusForbidden,
	idem.ECodeRequestMalformed:           http.StatusUnprocessableEntity,
	idem.ECodeValidationFailed:           http.StatusUnprocessableEntity,
	idem.ECodeBodyTooLarge:               http.StatusRequestEntityTooLarge,
	idem.ECodeUnsupportedMediaType:       http.StatusUnsupportedMediaType,
	idem.ECodeAPIVersionUnsupported:      http.StatusBadRequest,
	idem.ECodeNotFound:                   http.StatusNotFound,
	idem.ECodeMethodNotAllowed:           http.StatusMethodNotAllowed,
	idem.ECodeOperationUnknown:           http.StatusNotFound,
	idem.ECodeRequestTimeout:             http.StatusRequestTimeout,
	idem.ECodeResponseTooLarge:           http.StatusInternalServerError,
	// The payments operation's own codes.
	payments.ECodeOutcomeUnknown:       http.StatusAccepted,
	payments.ECodeDuplicateMerchantRef: http.StatusConflict,
	payments.ECodeProviderKeyConflict:  http.StatusConflict,
	payments.ECodePaymentNotFound:      http.StatusNotFound,
	payments.ECodePaymentDeclined:      http.StatusPaymentRequired,
	payments.ECodeProviderUnavailable:  http.StatusServiceUnavailable,
	idem.ECodeStoreUnavailable:         http.StatusServiceUnavailable,
	idem.ECodeUnavailable:              http.StatusServiceUnavailable,
	idem.ECodeInternal:                 http.StatusInternalServerError,
}

// StatusOf returns the HTTP status of an error code (500 for unknown codes).
func StatusOf(code string) int {
	if s, ok := codeStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// writeError answers err as {"errorCode","message"} with its status. Internal
// details are logged, never sent.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	code := idem.ErrorCode(err)
	status := StatusOf(code)
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		// The client hung up: nobody reads this answer, and nothing failed
		// on our side. Its retry with the same key gets the real answer.
		logger.DebugContext(r.Context(), "client went away", "method", r.Method, "path", r.URL.Path, "err", err)
		code, status = idem.ECodeUnavailable, http.StatusServiceUnavailable
	} else if status >= 500 {
		logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	}
	if code == idem.ECodeRequestTimeout {
		// The rest of the body may still be on its way: end the connection.
		w.Header().Set("Connection", "close")
	}
	switch code {
	case idem.ECodeInProgress, idem.ECodeStoreUnavailable, idem.ECodeUnavailable, idem.ECodeNotHome, payments.ECodeProviderUnavailable, idem.ECodeReconciliationPending:
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, coordapi.Error{ErrorCode: code, Message: idem.ErrorMessage(err)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"errorCode":"INTERNAL","message":"Internal error."}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

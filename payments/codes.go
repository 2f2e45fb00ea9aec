package payments

import (
	"encoding/json"
	"net/http"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

// Error codes of the payments API. They are part of the API contract: never
// rename one. How each answers over HTTP is in Errors, which the node adds
// to its one table; docs/errors.md documents them.
const (
	// ECodeOutcomeUnknown: the provider may have charged but its answer
	// was lost; a retry with the same key asks the provider.
	ECodeOutcomeUnknown       = "PAYMENT_OUTCOME_UNKNOWN"
	ECodeDuplicateMerchantRef = "DUPLICATE_MERCHANT_REFERENCE"
	ECodeProviderKeyConflict  = "PROVIDER_KEY_CONFLICT"
	ECodePaymentNotFound      = "PAYMENT_NOT_FOUND"
	ECodePaymentDeclined      = "PAYMENT_DECLINED"
	ECodeProviderUnavailable  = "PROVIDER_UNAVAILABLE"
)

// Errors are the payments API's own codes, as an operation declares them
// for the node's one table (idemhttp.Errors.With).
var Errors = map[string]idemhttp.ErrorClass{
	ECodeOutcomeUnknown:       {Status: http.StatusAccepted, RetryAfter: 1, Title: "Payment outcome not known yet"},
	ECodeDuplicateMerchantRef: {Status: http.StatusConflict, Title: "Duplicate merchant reference"},
	ECodeProviderKeyConflict:  {Status: http.StatusConflict, Title: "Provider key conflict"},
	ECodePaymentNotFound:      {Status: http.StatusNotFound, Title: "Payment not found"},
	ECodePaymentDeclined:      {Status: http.StatusPaymentRequired, Title: "Payment declined"},
	ECodeProviderUnavailable:  {Status: http.StatusServiceUnavailable, RetryAfter: 1, Title: "Provider unavailable"},
}

// paymentProblem is an answer of the payments API that carries one of its
// codes and names a payment: RFC 9457 problem+json, as every error of the
// node is (type, title, status, detail, errorCode, message), with the
// payment's id as an extension member.
type paymentProblem struct {
	idemhttp.Problem
	PaymentID         string `json:"paymentId,omitempty"`
	ExistingPaymentID string `json:"existingPaymentId,omitempty"`
}

// problemResponse renders code's answer with message, naming a payment
// (p's PaymentID or ExistingPaymentID), by the node's table extended with
// Errors: the status, Content-Type and Retry-After any other surface sends
// for code.
func problemResponse(code, message string, p paymentProblem) idem.Response {
	table, err := idemhttp.DefaultErrors().With(Errors)
	if err != nil { // Errors redefines a code of the default table: a programming error
		panic(err)
	}
	prob, h := table.Problem(code, message)
	p.Problem = prob
	body, err := json.Marshal(p)
	if err != nil {
		panic(err) // strings only
	}
	headers := map[string]string{"Content-Type": h.Get("Content-Type")}
	if ra := h.Get("Retry-After"); ra != "" {
		headers["Retry-After"] = ra
	}
	return idem.Response{Status: prob.Status, Headers: headers, Body: body}
}

// Checkpoints of create_payment, in order: RECEIVED ->
// LOCAL_PAYMENT_CREATED -> PROVIDER_REQUEST_SENT -> PROVIDER_CONFIRMED ->
// COMPLETED. RECEIVED and COMPLETED are the engine's (package idem).
const (
	CheckpointLocalPaymentCreated idem.Checkpoint = "LOCAL_PAYMENT_CREATED"
	CheckpointProviderRequestSent idem.Checkpoint = "PROVIDER_REQUEST_SENT"
	CheckpointProviderConfirmed   idem.Checkpoint = "PROVIDER_CONFIRMED"
)

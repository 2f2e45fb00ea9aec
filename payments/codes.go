package payments

import "github.com/idemcoord/idem"

// Error codes of the payments API. They are part of the API contract: never
// rename one. Their HTTP statuses are in region's status table, and the
// README's error table lists them.
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

// Codes are every error code the payments API answers with besides the
// engine's (package idem), for a status table to cover.
var Codes = []string{
	ECodeOutcomeUnknown, ECodeDuplicateMerchantRef, ECodeProviderKeyConflict,
	ECodePaymentNotFound, ECodePaymentDeclined, ECodeProviderUnavailable,
}

// Checkpoints of create_payment, in order: RECEIVED ->
// LOCAL_PAYMENT_CREATED -> PROVIDER_REQUEST_SENT -> PROVIDER_CONFIRMED ->
// COMPLETED. RECEIVED and COMPLETED are the engine's (package idem).
const (
	CheckpointLocalPaymentCreated idem.Checkpoint = "LOCAL_PAYMENT_CREATED"
	CheckpointProviderRequestSent idem.Checkpoint = "PROVIDER_REQUEST_SENT"
	CheckpointProviderConfirmed   idem.Checkpoint = "PROVIDER_CONFIRMED"
)

package provider

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemcoord/idem/internal/strictjson"
)

// HTTP header names used by the provider API.
const (
	// HeaderIdempotencyKey carries the provider key of a charge.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFencingToken carries the caller's fencing token (an int64).
	HeaderFencingToken = "Idem-Fencing-Token"
	// HeaderReplayed is "true" on answers that replay an earlier outcome.
	HeaderReplayed = "Idempotent-Replayed"
)

// Error codes of the provider API, found in the errorCode field of error
// bodies and in [APIError.Code].
const (
	CodeKeyMissing          = "PROVIDER_KEY_MISSING"
	CodeKeyInvalid          = "PROVIDER_KEY_INVALID"
	CodeKeyReused           = "PROVIDER_KEY_REUSED"
	CodeFencingTokenInvalid = "FENCING_TOKEN_INVALID"
	CodeFencingTokenStale   = "FENCING_TOKEN_STALE"
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodeInvalidFault        = "INVALID_FAULT"
	CodeUnavailable         = "PROVIDER_UNAVAILABLE"
	CodeDeclined            = "PAYMENT_DECLINED"
	CodeChargeNotFound      = "CHARGE_NOT_FOUND"
	CodeNotFound            = "NOT_FOUND"
	CodeUnauthenticated     = "UNAUTHENTICATED"
)

// ProviderKeyPrefix starts every provider key: provider_payment_<paymentId>.
const ProviderKeyPrefix = "provider_payment_"

// StatusConfirmed is the status of every applied charge.
const StatusConfirmed = "CONFIRMED"

// DefaultSlowDelay is the delay of a slow fault that does not set one.
const DefaultSlowDelay = 5 * time.Second

// ProviderKeyFor returns the provider key of a payment:
// "provider_payment_" + paymentID.
func ProviderKeyFor(paymentID string) string { return ProviderKeyPrefix + paymentID }

// Charge is an applied charge, as answered by POST /v1/charges and
// GET /v1/charges/{providerKey}.
type Charge struct {
	ChargeID    string `json:"chargeId"`
	ProviderKey string `json:"providerKey"`
	Status      string `json:"status"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"accountId,omitempty"`
	// Reference is the reference the request that made the charge gave
	// (ChargeBody.Reference), "" if none.
	Reference string    `json:"reference,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// Replayed is set by [Client.Charge] when the provider answered with
	// Idempotent-Replayed: true (the key had already charged). It is not
	// part of the JSON body.
	Replayed bool `json:"-"`
}

// ChargeCounts counts charge applications, as answered by GET /admin/charges.
// A key replayed any number of times counts 1; a key that shows 2 was
// charged twice, which the simulator never does unless its log says so.
type ChargeCounts struct {
	Total int            `json:"total"`
	ByKey map[string]int `json:"byKey"`
}

// FaultMode selects how the simulator misbehaves on charge requests.
type FaultMode string

// Fault modes.
const (
	FaultNone       FaultMode = "none"
	FaultFail       FaultMode = "fail"
	FaultDecline    FaultMode = "decline"
	FaultSlow       FaultMode = "slow"
	FaultLoseAnswer FaultMode = "lose-answer"
)

// Fault is the active fault, set with PUT /admin/fault and read with
// GET /admin/fault. Its JSON form is
// {"mode":"slow","times":2,"delay":"2s"}.
type Fault struct {
	// Mode is the failure to inject; "" is read as none.
	Mode FaultMode
	// Times is how many charge requests the fault applies to; 0 means until
	// changed. GET /admin/fault answers the remaining count.
	Times int
	// Delay is how long a slow fault holds each request. It is ignored for
	// other modes; 0 means [DefaultSlowDelay].
	Delay time.Duration
}

type faultJSON struct {
	Mode  FaultMode `json:"mode"`
	Times int       `json:"times"`
	Delay string    `json:"delay,omitempty"`
}

// MarshalJSON encodes the fault with Delay as a Go duration string.
func (f Fault) MarshalJSON() ([]byte, error) {
	w := faultJSON{Mode: f.Mode, Times: f.Times}
	if f.Mode == "" {
		w.Mode = FaultNone
	}
	if f.Delay != 0 {
		w.Delay = f.Delay.String()
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the fault strictly (package strictjson: exact
// names, each once); delay is a Go duration string like "2s".
func (f *Fault) UnmarshalJSON(b []byte) error {
	var w faultJSON
	if err := strictjson.DecodeObject(b, &w); err != nil {
		return fmt.Errorf("provider: fault: %w", err)
	}
	var d time.Duration
	if w.Delay != "" {
		var err error
		if d, err = time.ParseDuration(w.Delay); err != nil {
			return fmt.Errorf("provider: fault delay: %w", err)
		}
	}
	*f = Fault{Mode: w.Mode, Times: w.Times, Delay: d}
	return nil
}

// ErrorBody is the JSON form of every error answer of the provider API.
type ErrorBody struct {
	ErrorCode string `json:"errorCode"`
	Message   string `json:"message"`
}

// ChargeBody is the JSON body of POST /v1/charges; the provider key and the
// fencing token travel in headers.
type ChargeBody struct {
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"accountId"`
	// Reference is the caller's own reference for the charge, kept with it
	// and returned with it, a replay included (a provider's metadata).
	// Optional; at most MaxReferenceLen letters, digits, '_' and '-'.
	Reference string `json:"reference,omitempty"`
}

// MaxReferenceLen bounds ChargeBody.Reference.
const MaxReferenceLen = 64

package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
)

// Operation is the operation name of POST /payments, part of every scope and
// every fingerprint.
const Operation = "create_payment"

// DefaultAPIVersion is assumed when a request has no Api-Version header.
const DefaultAPIVersion = "2026-05-01"

// APIVersions lists the Api-Version values the operation accepts.
var APIVersions = []string{DefaultAPIVersion}

// DefaultChannel is what a command without a channel means.
const DefaultChannel = "web"

// channels are the accepted channels, in their normal (lower) case.
var channels = map[string]bool{"web": true, "mobile": true, "api": true, "pos": true}

// currencyExponents maps the accepted ISO 4217 currencies to their number of
// minor-unit digits.
var currencyExponents = map[string]int{
	"EUR": 2, "USD": 2, "GBP": 2, "CHF": 2, "SEK": 2, "NOK": 2, "DKK": 2, "PLN": 2,
	"CZK": 2, "CAD": 2, "AUD": 2, "NZD": 2, "SGD": 2, "HKD": 2, "INR": 2, "BRL": 2,
	"MXN": 2, "ZAR": 2, "CNY": 2, "JPY": 0, "KRW": 0, "ISK": 0, "HUF": 2, "BHD": 3,
	"KWD": 3, "JOD": 3, "OMR": 3, "TND": 3,
}

// Limits of the command's fields.
const (
	maxIDLength     = 128
	maxRefLength    = 255
	maxAmountDigits = 15 // whole digits; keeps minor units well inside int64
)

// Command is a parsed, validated and normalised create_payment command. Two
// requests that the API treats as equal parse to equal Commands.
type Command struct {
	AccountID         string
	AmountMinor       int64
	Currency          string // upper case ISO 4217
	MerchantReference string
	Channel           string // lower case; DefaultChannel when omitted
	APIVersion        string
}

// wireCommand is the request body. Unknown fields are rejected.
type wireCommand struct {
	AccountID         *string         `json:"accountId"`
	Amount            json.RawMessage `json:"amount"`
	Currency          *string         `json:"currency"`
	MerchantReference *string         `json:"merchantReference"`
	Channel           *string         `json:"channel"`
}

// ParseCommand parses a request body sent under apiVersion ("" means
// DefaultAPIVersion). Errors are *idem.Error: REQUEST_MALFORMED for bodies that
// are not one JSON object, REQUEST_VALIDATION_FAILED for unknown fields and
// invalid values, API_VERSION_UNSUPPORTED for an unknown Api-Version.
func ParseCommand(body []byte, apiVersion string) (Command, error) {
	if apiVersion == "" {
		apiVersion = DefaultAPIVersion
	}
	if !validAPIVersion(apiVersion) {
		return Command{}, idem.Errorf(idem.ECodeAPIVersionUnsupported, "Api-Version %q is not supported; supported: %s.", apiVersion, strings.Join(APIVersions, ", "))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w wireCommand
	if err := dec.Decode(&w); err != nil {
		if msg, ok := unknownField(err); ok {
			return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Unknown field %s.", msg)
		}
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Field %q has the wrong type.", typeErr.Field)
		}
		return Command{}, &idem.Error{Code: idem.ECodeRequestMalformed, Message: "The body is not a valid JSON object.", Err: err}
	}
	if _, err := dec.Token(); err != io.EOF {
		return Command{}, idem.Errorf(idem.ECodeRequestMalformed, "The body must hold exactly one JSON object.")
	}
	c := Command{APIVersion: apiVersion, Channel: DefaultChannel}
	var err error
	if c.AccountID, err = requiredID("accountId", w.AccountID, maxIDLength); err != nil {
		return Command{}, err
	}
	if c.MerchantReference, err = requiredID("merchantReference", w.MerchantReference, maxRefLength); err != nil {
		return Command{}, err
	}
	if w.Currency == nil {
		return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"currency\" is required.")
	}
	c.Currency = strings.ToUpper(*w.Currency)
	exp, ok := currencyExponents[c.Currency]
	if !ok {
		return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Currency %q is not supported.", *w.Currency)
	}
	if c.AmountMinor, err = parseAmount(w.Amount, exp); err != nil {
		return Command{}, err
	}
	if w.Channel != nil {
		c.Channel = strings.ToLower(*w.Channel)
		if !channels[c.Channel] {
			return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Channel %q is not one of web, mobile, api, pos.", *w.Channel)
		}
	}
	return c, nil
}

func validAPIVersion(v string) bool {
	for _, s := range APIVersions {
		if s == v {
			return true
		}
	}
	return false
}

func unknownField(err error) (string, bool) {
	const prefix = "json: unknown field "
	if s := err.Error(); strings.HasPrefix(s, prefix) {
		return strings.TrimPrefix(s, prefix), true
	}
	return "", false
}

func requiredID(name string, v *string, maxLen int) (string, error) {
	if v == nil || *v == "" {
		return "", idem.Errorf(idem.ECodeValidationFailed, "Field %q is required.", name)
	}
	if len(*v) > maxLen {
		return "", idem.Errorf(idem.ECodeValidationFailed, "Field %q is longer than %d bytes.", name, maxLen)
	}
	for _, r := range *v {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return "", idem.Errorf(idem.ECodeValidationFailed, "Field %q holds a control or invalid character.", name)
		}
	}
	return *v, nil
}

// parseAmount reads a positive decimal amount, given as a JSON string ("10.00")
// or number (10.0), into minor units of a currency with exp fraction digits.
// Trailing zeros are insignificant ("10.0" == "10.00"); more significant
// fraction digits than the currency has are rejected, never rounded.
func parseAmount(raw json.RawMessage, exp int) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" is required.")
	}
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" is not a decimal.")
		}
	} else {
		s = string(raw)
	}
	bad := idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" must be a positive decimal such as \"10.00\", not %.40q.", s)
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" || !digits(whole) || (hasDot && (frac == "" || !digits(frac))) {
		return 0, bad
	}
	whole = strings.TrimLeft(whole, "0")
	frac = strings.TrimRight(frac, "0")
	if len(whole) > maxAmountDigits {
		return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" is too large.")
	}
	if len(frac) > exp {
		return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" has more fraction digits than the currency allows (%d).", exp)
	}
	minor := whole + frac + strings.Repeat("0", exp-len(frac))
	n, err := strconv.ParseInt("0"+minor, 10, 64)
	if err != nil || n <= 0 {
		return 0, bad
	}
	return n, nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Amount formats the command's amount as a decimal with the currency's
// fraction digits ("10.00").
func (c Command) Amount() string { return FormatMinor(c.AmountMinor, c.Currency) }

// FormatMinor formats minor units of currency as a decimal string.
func FormatMinor(minor int64, currency string) string {
	exp := currencyExponents[currency]
	s := strconv.FormatInt(minor, 10)
	if exp == 0 {
		return s
	}
	if len(s) <= exp {
		s = strings.Repeat("0", exp-len(s)+1) + s
	}
	return s[:len(s)-exp] + "." + s[len(s)-exp:]
}

// Fingerprint returns the command's request hash under every supported hash
// version, current first (see package fingerprint).
func (c Command) Fingerprint() ([]string, error) {
	h, err := fingerprint.Hash(Operation, c.fields())
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	return []string{h}, nil
}

// fields is what the hash covers: every normalised field and the Api-Version
// header. Authorization, the idempotency key and transport metadata are not
// part of it; create_payment has no path parameters.
func (c Command) fields() map[string]any {
	return map[string]any{
		"apiVersion":        c.APIVersion,
		"accountId":         c.AccountID,
		"amountMinor":       c.AmountMinor,
		"currency":          c.Currency,
		"merchantReference": c.MerchantReference,
		"channel":           c.Channel,
	}
}

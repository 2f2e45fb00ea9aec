package payments

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/strictjson"
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

// wireCommand is the request body, decoded by package strictjson: names
// match exactly, duplicates and unknown names are rejected.
type wireCommand struct {
	AccountID         *string        `json:"accountId"`
	Amount            jsontext.Value `json:"amount"`
	Currency          *string        `json:"currency"`
	MerchantReference *string        `json:"merchantReference"`
	Channel           *string        `json:"channel"`
}

// ParseCommand parses a request body sent under apiVersion ("" means
// DefaultAPIVersion). Errors are *idem.Error: REQUEST_MALFORMED for bodies that
// are not one strict JSON object (syntax, a member name twice, invalid UTF-8,
// nesting deeper than strictjson.MaxDepth, trailing data),
// REQUEST_VALIDATION_FAILED for a body that is not an object, unknown fields
// (names are case-sensitive) and invalid values, API_VERSION_UNSUPPORTED for
// an unknown Api-Version. Messages never quote the body.
func ParseCommand(body []byte, apiVersion string) (Command, error) {
	if apiVersion == "" {
		apiVersion = DefaultAPIVersion
	}
	if !validAPIVersion(apiVersion) {
		return Command{}, errAPIVersion()
	}
	var w wireCommand
	if err := strictjson.DecodeObject(body, &w); err != nil {
		return Command{}, strictjson.ClientError(err)
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
	// Enums are ASCII: strings.ToUpper would map "uſd" (long s) to "USD".
	c.Currency = asciiUpper(*w.Currency)
	exp, ok := currencyExponents[c.Currency]
	if !ok {
		return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"currency\" is not a supported ISO 4217 code.")
	}
	if c.AmountMinor, err = parseAmount(w.Amount, exp); err != nil {
		return Command{}, err
	}
	if w.Channel != nil {
		c.Channel = asciiLower(*w.Channel)
		if !channels[c.Channel] {
			return Command{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"channel\" is not one of web, mobile, api, pos.")
		}
	}
	return c, nil
}

// asciiUpper upper-cases ASCII letters only. A string with any other byte
// than ASCII letters is returned as is (and then matches no enum value).
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		case c >= 'A' && c <= 'Z':
		default:
			return s
		}
	}
	return string(b)
}

// asciiLower lower-cases ASCII letters only, like asciiUpper.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c - 'A' + 'a'
		case c >= 'a' && c <= 'z':
		default:
			return s
		}
	}
	return string(b)
}

func errAPIVersion() error {
	return idem.Errorf(idem.ECodeAPIVersionUnsupported, "The Api-Version is not supported; supported: %s.", strings.Join(APIVersions, ", "))
}

func validAPIVersion(v string) bool {
	for _, s := range APIVersions {
		if s == v {
			return true
		}
	}
	return false
}

// requiredID checks an identifier: present, at most maxLen bytes, and
// acceptable to package ident (NFC, no control or bidirectional control
// characters). Non-NFC identifiers are rejected, not normalised.
func requiredID(name string, v *string, maxLen int) (string, error) {
	if v == nil || *v == "" {
		return "", idem.Errorf(idem.ECodeValidationFailed, "Field %q is required.", name)
	}
	if len(*v) > maxLen {
		return "", idem.Errorf(idem.ECodeValidationFailed, "Field %q is longer than %d bytes.", name, maxLen)
	}
	switch err := ident.Check(*v); {
	case errors.Is(err, ident.ErrNotNFC):
		return "", &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("Field %q must be in Unicode Normalization Form C.", name), Err: err}
	case err != nil:
		return "", &idem.Error{Code: idem.ECodeValidationFailed, Message: fmt.Sprintf("Field %q holds a control, bidirectional control or invalid character.", name), Err: err}
	}
	return *v, nil
}

// parseAmount reads a positive decimal amount, given as a JSON string ("10.00")
// or number (10.0), into minor units of a currency with exp fraction digits.
// Trailing zeros are insignificant ("10.0" == "10.00"); more significant
// fraction digits than the currency has are rejected, never rounded.
func parseAmount(raw jsontext.Value, exp int) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" is required.")
	}
	var s string
	switch raw.Kind() {
	case '"':
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" is not a decimal.")
		}
	case '0':
		s = string(raw)
	default:
		return 0, idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" must be a decimal string or number.")
	}
	bad := func() error {
		return idem.Errorf(idem.ECodeValidationFailed, "Field \"amount\" must be a positive decimal such as \"10.00\".")
	}
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" || !digits(whole) || (hasDot && (frac == "" || !digits(frac))) {
		return 0, bad()
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
		return 0, bad()
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
	h, err := fingerprint.Hashes(Operation, c.fields())
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	return h, nil
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

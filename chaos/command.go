package chaos

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Command is one logical create_payment command as a client means it. Two
// requests carrying the same Command are the same command, however their
// bodies are serialised.
type Command struct {
	AccountID         string `json:"accountId"`
	AmountMinor       int64  `json:"amountMinor"` // in cents: every currency the workload uses has two minor digits
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchantReference"`
	Channel           string `json:"channel"` // lower case; "web" is the default
}

// ID is the command's identity: its normalised fields, as the service's
// contract defines sameness (amount in minor units, upper-case currency,
// lower-case channel with "web" as the default).
func (c Command) ID() string {
	ch := strings.ToLower(c.Channel)
	if ch == "" {
		ch = "web"
	}
	return fmt.Sprintf("%s|%d|%s|%s|%s", c.AccountID, c.AmountMinor, strings.ToUpper(c.Currency), c.MerchantReference, ch)
}

// String is a short description for reports.
func (c Command) String() string {
	return fmt.Sprintf("%s %s %s ref=%s", c.AccountID, formatMinor(c.AmountMinor, 2), strings.ToUpper(c.Currency), c.MerchantReference)
}

// formatMinor renders minor units with digits decimals ("10.00").
func formatMinor(minor int64, digits int) string {
	s := strconv.FormatInt(minor, 10)
	for len(s) <= digits {
		s = "0" + s
	}
	return s[:len(s)-digits] + "." + s[len(s)-digits:]
}

// amountVariants lists equivalent spellings of an amount in cents, as JSON
// values: "10.50", "10.5", "10" and "10.0" where the zeros allow, each as a
// string and as a number.
func amountVariants(minor int64) []string {
	canon := formatMinor(minor, 2)
	spellings := []string{canon}
	if t := strings.TrimSuffix(strings.TrimRight(canon, "0"), "."); t != canon {
		spellings = append(spellings, t)
	}
	if strings.HasSuffix(canon, ".00") {
		spellings = append(spellings, canon[:len(canon)-1])
	}
	out := make([]string, 0, 2*len(spellings))
	for _, s := range spellings {
		out = append(out, strconv.Quote(s), s)
	}
	return out
}

// Serialise renders c as a JSON body. Variant 0 is the canonical form (the
// docs/http-api.md's field order, "10.00", upper-case currency, channel present);
// other variants reorder the fields, respell the amount, change the case of
// the currency and channel, omit or add the default channel and change the
// whitespace, all of which the service must treat as the same command. rng
// picks among the equivalent spellings.
func (c Command) Serialise(variant int, rng *rand.Rand) []byte {
	type field struct{ name, value string }
	amount := strconv.Quote(formatMinor(c.AmountMinor, 2))
	currency := strings.ToUpper(c.Currency)
	channel := strings.ToLower(c.Channel)
	if channel == "" {
		channel = "web"
	}
	includeChannel := true
	if variant != 0 {
		vs := amountVariants(c.AmountMinor)
		amount = vs[rng.IntN(len(vs))]
		switch rng.IntN(3) {
		case 0:
			currency = strings.ToLower(currency)
		case 1:
			currency = currency[:1] + strings.ToLower(currency[1:])
		}
		switch rng.IntN(3) {
		case 0:
			channel = strings.ToUpper(channel)
		case 1:
			if channel == "web" {
				includeChannel = false
			}
		}
	}
	fields := []field{
		{"accountId", strconv.Quote(c.AccountID)},
		{"amount", amount},
		{"currency", strconv.Quote(currency)},
		{"merchantReference", strconv.Quote(c.MerchantReference)},
	}
	if includeChannel {
		fields = append(fields, field{"channel", strconv.Quote(channel)})
	}
	sep, colon := ",", ":"
	if variant != 0 {
		rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
		if rng.IntN(2) == 0 {
			sep, colon = ", ", ": "
		}
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(strconv.Quote(f.name))
		b.WriteString(colon)
		b.WriteString(f.value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

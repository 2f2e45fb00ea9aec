package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemcoord/idem/store"
)

// Ledger entry types (ledger_entries.entry_type).
const (
	// EntryPaymentCreated is the ledger entry of a PaymentCreated event; its
	// entry id is "ledger_payment_created_<paymentId>".
	EntryPaymentCreated = "payment_created"
	// EntryPaymentConfirmed is the ledger entry of a PaymentConfirmed event;
	// its entry id is "ledger_payment_<paymentId>".
	EntryPaymentConfirmed = "payment_confirmed"
)

// Rejection codes of the built-in handlers (consumer_inbox.error_code).
const (
	// RejectMalformedPayload: the payload is not a payment event.
	RejectMalformedPayload = "MALFORMED_PAYLOAD"
	// RejectUnsupportedEvent: the consumer does not handle the event type.
	RejectUnsupportedEvent = "UNSUPPORTED_EVENT_TYPE"
)

// paymentEvent is the payload of the payment domain's events.
type paymentEvent struct {
	EventID   string `json:"eventId"`
	Type      string `json:"type"`
	PaymentID string `json:"paymentId"`
	AccountID string `json:"accountId"`
	Amount    string `json:"amount"` // decimal, in major units ("12.50")
	Currency  string `json:"currency"`
}

func decodePaymentEvent(m Message) (paymentEvent, error) {
	var ev paymentEvent
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return ev, Reject(RejectMalformedPayload, fmt.Errorf("message %s: %w", m.ID, err))
	}
	if ev.PaymentID == "" || ev.AccountID == "" || ev.Amount == "" || ev.Currency == "" {
		return ev, Reject(RejectMalformedPayload, fmt.Errorf("message %s: payment event without paymentId, accountId, amount or currency", m.ID))
	}
	return ev, nil
}

// HandleLedger is ConsumerLedger's handler: it writes one ledger_entries row
// per PaymentCreated (EntryPaymentCreated) and PaymentConfirmed
// (EntryPaymentConfirmed) event, with ON CONFLICT DO NOTHING on the entry id
// and on unique(entry_type, source_payment_id). Other event types and
// malformed payloads are rejected.
func HandleLedger(ctx context.Context, q store.Querier, m Message) error {
	var entryType, entryID string
	switch m.Type {
	case EventPaymentCreated:
		entryType = EntryPaymentCreated
	case EventPaymentConfirmed:
		entryType = EntryPaymentConfirmed
	default:
		return Reject(RejectUnsupportedEvent, fmt.Errorf("ledger: event type %q", m.Type))
	}
	ev, err := decodePaymentEvent(m)
	if err != nil {
		return err
	}
	entryID = ledgerEntryID(entryType, ev.PaymentID)
	if _, err := q.Exec(ctx, `INSERT INTO ledger_entries
			(entry_id, entry_type, source_payment_id, source_event_id, tenant_id, account_id, amount, currency, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
		ON CONFLICT DO NOTHING`,
		entryID, entryType, ev.PaymentID, m.ID, m.Tenant, ev.AccountID, ev.Amount, ev.Currency); err != nil {
		return fmt.Errorf("ledger: insert entry %s: %w", entryID, err)
	}
	return nil
}

// HandleReceiptEmail is ConsumerReceiptEmail's handler: for a
// PaymentConfirmed event it persists the receipt to send as an
// email_notifications row with dedupe key "receipt_payment_<paymentId>" (ON
// CONFLICT DO NOTHING). It sends nothing: a Sender does, after this row has
// committed. Other event types and malformed payloads are rejected.
func HandleReceiptEmail(ctx context.Context, q store.Querier, m Message) error {
	if m.Type != EventPaymentConfirmed {
		return Reject(RejectUnsupportedEvent, fmt.Errorf("receipt-email: event type %q", m.Type))
	}
	ev, err := decodePaymentEvent(m)
	if err != nil {
		return err
	}
	key := receiptDedupeKey(ev.PaymentID)
	if _, err := q.Exec(ctx, `INSERT INTO email_notifications
			(dedupe_key, tenant_id, payment_id, account_id, amount, currency, created_at, attempts)
		VALUES ($1, $2, $3, $4, $5, $6, now(), 0)
		ON CONFLICT (dedupe_key) DO NOTHING`,
		key, m.Tenant, ev.PaymentID, ev.AccountID, ev.Amount, ev.Currency); err != nil {
		return fmt.Errorf("receipt-email: insert notification %s: %w", key, err)
	}
	return nil
}

// ledgerEntryID is the entry id of a payment's ledger entry of entryType.
func ledgerEntryID(entryType, paymentID string) string {
	if entryType == EntryPaymentCreated {
		return "ledger_payment_created_" + paymentID
	}
	return "ledger_payment_" + paymentID
}

// receiptDedupeKey is the dedupe key of a payment's receipt email.
func receiptDedupeKey(paymentID string) string { return "receipt_payment_" + paymentID }

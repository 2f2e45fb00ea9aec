package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/store"
)

// Replay rules: what a retry sees when the response it replays was written
// under an older response schema than the node now serves.
const (
	// ReplayAsStored replays the first response byte for byte, whatever
	// schema it was written in (the default: a replay is a replay).
	ReplayAsStored = "replay-as-stored"
	// ReconstructCurrent rebuilds a completed payment's response from the
	// payment row in the current schema, keeping the first status code.
	ReconstructCurrent = "reconstruct-current"
)

// v2Response is the v2 body of a payment. Field order is part of the contract.
type v2Response struct {
	PaymentID         string `json:"paymentId"`
	Status            string `json:"status"`
	AccountID         string `json:"accountId"`
	Amount            string `json:"amount"`
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchantReference"`
	Channel           string `json:"channel"`
}

// v3Response is the v3 body: renamed id and state, and the creation time.
type v3Response struct {
	ID                string `json:"id"`
	State             string `json:"state"`
	CreatedAt         string `json:"createdAt"`
	AccountID         string `json:"accountId"`
	Amount            string `json:"amount"`
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchantReference"`
	Channel           string `json:"channel"`
}

// renderers render a payment in each response schema.
var renderers = map[string]func(store.Payment) ([]byte, error){
	"v2": func(p store.Payment) ([]byte, error) {
		return json.Marshal(v2Response{PaymentID: p.ID, Status: p.Status, AccountID: p.AccountID,
			Amount: FormatMinor(p.AmountMinor, p.Currency), Currency: p.Currency,
			MerchantReference: p.MerchantReference, Channel: p.Channel})
	},
	"v3": func(p store.Payment) ([]byte, error) {
		return json.Marshal(v3Response{ID: p.ID, State: p.Status, CreatedAt: p.CreatedAt.UTC().Format(time.RFC3339),
			AccountID: p.AccountID, Amount: FormatMinor(p.AmountMinor, p.Currency), Currency: p.Currency,
			MerchantReference: p.MerchantReference, Channel: p.Channel})
	},
}

// completion renders the 201 answer of a payment that is about to be (or has
// already been) written in q's transaction. v3 needs the payment's creation
// time: the stored row's created_at, or, for a payment this transaction is
// about to insert, the transaction's now() (which the insert will write).
func (s *Service) completion(ctx context.Context, q store.Querier, p store.Payment) (idem.Completion, error) {
	if s.cfg.ResponseSchema == "v3" && p.CreatedAt.IsZero() {
		if err := q.QueryRow(ctx, `SELECT COALESCE((SELECT created_at FROM payments WHERE tenant_id = $1 AND payment_id = $2), now())`,
			p.Tenant, p.ID).Scan(&p.CreatedAt); err != nil {
			return idem.Completion{}, fmt.Errorf("payments: read payment creation time: %w", err)
		}
	}
	body, err := renderers[s.cfg.ResponseSchema](p)
	if err != nil {
		return idem.Completion{}, fmt.Errorf("payments: render payment: %w", err)
	}
	return idem.Completion{
		Response: idem.Response{
			Status:        201,
			Headers:       map[string]string{"Content-Type": "application/json", "Location": "/payments/" + p.ID},
			Body:          body,
			SchemaVersion: s.cfg.ResponseSchema,
		},
		ResourceType: "payment",
		ResourceID:   p.ID,
	}, nil
}

// replay returns the answer to a retry of a finished record, following the
// replay rule.
func (s *Service) replay(ctx context.Context, q store.Querier, rec *idem.Record) (idem.Response, error) {
	stored := *rec.Response
	if s.cfg.ReplayRule != ReconstructCurrent || stored.SchemaVersion == s.cfg.ResponseSchema ||
		rec.Status != idem.StatusCompleted || rec.ResourceType != "payment" {
		return stored, nil
	}
	p, err := store.GetPayment(ctx, q, rec.Tenant, rec.ResourceID)
	if err != nil {
		return idem.Response{}, paymentNotFound(err, "The payment does not exist.")
	}
	body, err := renderers[s.cfg.ResponseSchema](p)
	if err != nil {
		return idem.Response{}, fmt.Errorf("payments: render payment: %w", err)
	}
	return idem.Response{Status: stored.Status, Headers: stored.Headers, Body: body, SchemaVersion: s.cfg.ResponseSchema}, nil
}

// replayRecord is create_payment's engine Replay: the stored answer,
// following the replay rule.
func (s *Service) replayRecord(ctx context.Context, rec *idem.Record) (idem.Response, error) {
	return s.replay(ctx, s.store.Pool(), rec)
}

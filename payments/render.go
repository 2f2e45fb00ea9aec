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
var renderers = map[string]func(Payment) ([]byte, error){
	"v2": func(p Payment) ([]byte, error) {
		return json.Marshal(v2Response{PaymentID: p.ID, Status: p.Status, AccountID: p.AccountID,
			Amount: FormatMinor(p.AmountMinor, p.Currency), Currency: p.Currency,
			MerchantReference: p.MerchantReference, Channel: p.Channel})
	},
	"v3": func(p Payment) ([]byte, error) {
		return json.Marshal(v3Response{ID: p.ID, State: p.Status, CreatedAt: p.CreatedAt.UTC().Format(time.RFC3339),
			AccountID: p.AccountID, Amount: FormatMinor(p.AmountMinor, p.Currency), Currency: p.Currency,
			MerchantReference: p.MerchantReference, Channel: p.Channel})
	},
}

// PaymentStatusPending is a payment's status when it is created, and so the
// status the 201 answer to its creation shows (GET /payments/{id} shows the
// status as it moves on).
const PaymentStatusPending = "PENDING"

// showsCreationTime reports whether schema's body shows the payment's
// creation time.
func showsCreationTime(schema string) bool { return schema == "v3" }

// render renders p in schema.
func render(schema string, p Payment) ([]byte, error) {
	r, ok := renderers[schema]
	if !ok {
		return nil, fmt.Errorf("payments: no renderer for response schema %q", schema)
	}
	body, err := r(p)
	if err != nil {
		return nil, fmt.Errorf("payments: render payment: %w", err)
	}
	return body, nil
}

// created is the 201 answer to a payment's creation in schema: the payment
// as created. It is a pure function of the payment's immutable fields (id,
// account, amount, currency, merchant reference, channel, creation time)
// and the schema: the status shown is always the creation status, whatever
// the payment's status is now. That is what lets a record store a
// reference to the payment instead of the answer (idem.Response.ByReference)
// and render it again, byte for byte, on replay.
func created(schema string, p Payment) (idem.Response, error) {
	p.Status = PaymentStatusPending
	body, err := render(schema, p)
	if err != nil {
		return idem.Response{}, err
	}
	return idem.Response{
		Status:        201,
		Headers:       createdHeaders(p.ID),
		Body:          body,
		SchemaVersion: schema,
	}, nil
}

// createdHeaders are the headers of the 201 answer to payment id's creation.
func createdHeaders(id string) map[string]string {
	return map[string]string{"Content-Type": "application/json", "Location": "/payments/" + id}
}

// completion renders the 201 answer of a payment that is about to be (or has
// already been) written in q's transaction. v3 needs the payment's creation
// time: the stored row's created_at, or, for a payment this transaction is
// about to insert, the transaction's now() (which the insert will write).
// The record references the payment instead of storing the answer, unless
// Config.StoreBodies.
func (s *Service) completion(ctx context.Context, q store.Querier, p Payment) (idem.Completion, error) {
	if showsCreationTime(s.cfg.ResponseSchema) && p.CreatedAt.IsZero() {
		if err := q.QueryRow(ctx, `SELECT COALESCE((SELECT created_at FROM payments WHERE tenant_id = $1 AND payment_id = $2), now())`,
			p.Tenant, p.ID).Scan(&p.CreatedAt); err != nil {
			return idem.Completion{}, fmt.Errorf("payments: read payment creation time: %w", err)
		}
	}
	resp, err := created(s.cfg.ResponseSchema, p)
	if err != nil {
		return idem.Completion{}, err
	}
	resp.ByReference = !s.cfg.StoreBodies
	return idem.Completion{Response: resp, ResourceType: "payment", ResourceID: p.ID}, nil
}

// replay returns the answer to a retry of a finished record, following the
// replay rule. A referencing record's answer is rendered again from its
// payment: p when the caller read it with the record, otherwise read here
// (getPayment).
func (s *Service) replay(ctx context.Context, rec *idem.Record, p *Payment) (idem.Response, error) {
	stored := *rec.Response
	current := s.cfg.ReplayRule == ReconstructCurrent && stored.SchemaVersion != s.cfg.ResponseSchema &&
		rec.Status == idem.StatusCompleted && rec.ResourceType == "payment"
	if !current && !stored.ByReference {
		return stored, nil
	}
	if p == nil || p.ID != rec.ResourceID {
		got, err := s.getPayment(ctx, rec.Tenant, rec.ResourceID)
		if err != nil {
			return idem.Response{}, paymentNotFound(err, "The payment does not exist.")
		}
		p = &got
	}
	if !current {
		resp, err := created(stored.SchemaVersion, *p)
		resp.Status = stored.Status
		return resp, err
	}
	// The payment as it is now, in the current schema, with the first
	// status code.
	body, err := render(s.cfg.ResponseSchema, *p)
	if err != nil {
		return idem.Response{}, err
	}
	headers := stored.Headers
	if stored.ByReference {
		headers = createdHeaders(p.ID)
	}
	return idem.Response{Status: stored.Status, Headers: headers, Body: body, SchemaVersion: s.cfg.ResponseSchema}, nil
}

// replayRecord is create_payment's engine Replay: the stored answer,
// following the replay rule.
func (s *Service) replayRecord(ctx context.Context, rec *idem.Record) (idem.Response, error) {
	return s.replay(ctx, rec, nil)
}

// getPayment reads a payment through the store's retrying Read: sessions
// run at SERIALIZABLE, where even a lone read can be chosen to fail
// (SQLSTATE 40001) beside concurrent writers, and a replay must not answer
// that as an internal error.
func (s *Service) getPayment(ctx context.Context, tenant, id string) (Payment, error) {
	var p Payment
	err := s.store.Read(ctx, func(q store.Querier) (err error) {
		p, err = GetPayment(ctx, q, tenant, id)
		return err
	})
	return p, err
}

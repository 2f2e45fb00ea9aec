package payments_test

import (
	"bytes"
	"context"
	"maps"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
)

// TestReferencingRecords: a completed payment's record holds the payment
// reference and the schema version, not the answer (no body, no headers),
// and every replay renders the first answer again byte for byte, with its
// headers, in the schema it was written in: from the fast path's joined
// read, from the claim's own read (the fast path off), after the payment
// moved on (CONFIRMED), and from a node that now writes another schema.
// With StoreBodies the answer is stored as before.
func TestReferencingRecords(t *testing.T) {
	ctx := context.Background()
	st, url := storetest.New(t)
	claimFirst, err := store.Open(ctx, url, store.Options{NoReplayRead: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(claimFirst.Close)

	for i, schema := range []string{"v2", "v3"} {
		t.Run(schema, func(t *testing.T) {
			svc := payments.NewService(st, payments.Config{ResponseSchema: schema})
			key := "ref-" + schema
			body := []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"ref-` + schema + `"}`)
			req := payments.Request{Tenant: "tenant-a", Key: key, Body: body}
			first, err := svc.Create(ctx, req)
			if err != nil || first.Response.Status != 201 || first.Replayed || len(first.Response.Body) == 0 {
				t.Fatalf("first = %+v, %v", first, err)
			}
			if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1
				AND response_by_reference AND response_body IS NULL AND response_headers IS NULL
				AND response_status = 201 AND response_schema_version = $2 AND resource_type = 'payment'
				AND resource_id = (SELECT payment_id FROM payments WHERE merchant_reference = $3)`, key, schema, "ref-"+schema); n != 1 {
				t.Fatalf("record of %s: want a reference to its payment and schema %s, no body or headers", key, schema)
			}
			same := func(label string, res payments.Result, err error) {
				t.Helper()
				if err != nil || !res.Replayed || res.Response.Status != 201 || res.Response.SchemaVersion != schema ||
					!bytes.Equal(res.Response.Body, first.Response.Body) || !maps.Equal(res.Response.Headers, first.Response.Headers) {
					t.Errorf("%s = %d %s %v %s, %v; want the first answer %d %v %s replayed", label, res.Response.Status,
						res.Response.SchemaVersion, res.Response.Headers, res.Response.Body, err, first.Response.Status, first.Response.Headers, first.Response.Body)
				}
			}
			res, err := svc.Create(ctx, req)
			same("replay from the fast path", res, err)
			res, err = payments.NewService(claimFirst, payments.Config{ResponseSchema: schema}).Create(ctx, req)
			same("replay from the claim's read", res, err)

			storetest.Exec(t, st, `UPDATE payments SET status = 'CONFIRMED' WHERE merchant_reference = $1`, "ref-"+schema)
			res, err = svc.Create(ctx, req)
			same("replay after the payment moved on", res, err)
			other := []string{"v3", "v2"}[i]
			res, err = payments.NewService(st, payments.Config{ResponseSchema: other}).Create(ctx, req)
			same("replay on a node writing "+other, res, err)

			// reconstruct-current answers the payment as it is now, in the
			// node's schema, with the first status code.
			res, err = payments.NewService(st, payments.Config{ResponseSchema: other, ReplayRule: payments.ReconstructCurrent}).Create(ctx, req)
			if err != nil || !res.Replayed || res.Response.Status != 201 || res.Response.SchemaVersion != other ||
				!bytes.Contains(res.Response.Body, []byte(`"CONFIRMED"`)) || res.Response.Headers["Location"] != first.Response.Headers["Location"] {
				t.Errorf("reconstruct-current = %d %s %v %s, %v; want the confirmed payment in %s", res.Response.Status,
					res.Response.SchemaVersion, res.Response.Headers, res.Response.Body, err, other)
			}
		})
	}

	t.Run("store bodies", func(t *testing.T) {
		svc := payments.NewService(st, payments.Config{StoreBodies: true})
		req := payments.Request{Tenant: "tenant-a", Key: "stored", Body: []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"stored"}`)}
		first, err := svc.Create(ctx, req)
		if err != nil || first.Response.Status != 201 {
			t.Fatalf("first = %+v, %v", first, err)
		}
		if n := storetest.Count(t, st, `SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'stored'
			AND NOT response_by_reference AND response_body = $1 AND response_headers IS NOT NULL`, first.Response.Body); n != 1 {
			t.Fatal("StoreBodies: want the answer stored in the record")
		}
		again, err := payments.NewService(st, payments.Config{}).Create(ctx, req)
		if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, first.Response.Body) {
			t.Errorf("replay = %+v, %v; want the stored answer", again, err)
		}
	})

	t.Run("handover", func(t *testing.T) {
		// A referencing record handed over to the store of the tenant's
		// new home comes with its payment, and replays there as it did.
		newHome, _ := storetest.New(t)
		req := payments.Request{Tenant: "tenant-moved", Key: "moved", Body: []byte(article)}
		first, err := payments.NewService(st, payments.Config{}).Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if rep, err := store.Handover(ctx, st, newHome, "tenant-moved", payments.HandoverRows); err != nil || rep.Copied != 1 || rep.Rows != 1 {
			t.Fatalf("handover = %+v, %v; want the record and its payment copied", rep, err)
		}
		again, err := payments.NewService(newHome, payments.Config{}).Create(ctx, req)
		if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, first.Response.Body) {
			t.Errorf("replay in the new home = %+v, %v; want the first answer", again, err)
		}
	})

	t.Run("payment gone", func(t *testing.T) {
		// A referencing record's payment is what its replay renders:
		// without it there is nothing to answer but that the payment does
		// not exist (the product never deletes one; an operator might).
		svc := payments.NewService(st, payments.Config{})
		req := payments.Request{Tenant: "tenant-a", Key: "gone", Body: []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"gone"}`)}
		if _, err := svc.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		storetest.Exec(t, st, `DELETE FROM outbox_events WHERE aggregate_id IN (SELECT payment_id FROM payments WHERE merchant_reference = 'gone')`)
		storetest.Exec(t, st, `DELETE FROM payments WHERE merchant_reference = 'gone'`)
		if _, err := svc.Create(ctx, req); idem.ErrorCode(err) != payments.ECodePaymentNotFound {
			t.Errorf("replay without its payment = %v, want %s", err, payments.ECodePaymentNotFound)
		}
	})
}

package ambiguous_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/store"
	"github.com/idemcoord/idem/tests/commitcut"
)

// TestCreateResolvesAnAmbiguousCommit loses the answer to the commit of the
// one statement (an implicit transaction) that stores a payment and its
// record (no provider), while the store commits it: Create must answer the stored payment, not a
// failure, and one payment exists; in either claim order.
func TestCreateResolvesAnAmbiguousCommit(t *testing.T) {
	for name, order := range map[string]payments.ClaimOrder{"claim first": payments.ClaimFirst, "read first": payments.ReadFirst} {
		t.Run(name, func(t *testing.T) { testCreateResolvesAnAmbiguousCommit(t, order) })
	}
}

func testCreateResolvesAnAmbiguousCommit(t *testing.T, order payments.ClaimOrder) {
	ctx := context.Background()
	direct, dbURL := storetest.New(t)
	cut := commitcut.New(t, dbURL)
	st, err := store.Open(ctx, cut.URL, store.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	svc := payments.NewService(st, payments.Config{ClaimOrder: order})

	cut.Arm(1)
	res, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(article)})
	if !cut.Cut() {
		t.Fatal("no COMMIT lost its answer; the test injected nothing")
	}
	if err != nil || res.Response.Status != 201 {
		t.Fatalf("Create with its COMMIT's answer lost = %+v, %v; want the stored payment", res, err)
	}
	if n := storetest.Count(t, direct, `SELECT count(*) FROM payments WHERE tenant_id = 'tenant-a'`); n != 1 {
		t.Errorf("payments = %d, want 1", n)
	}
	rec, err := direct.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "k1"})
	if err != nil || rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 || rec.ResourceID == "" {
		t.Fatalf("record = %+v, %v; want COMPLETED with the answer given", rec, err)
	}
	again, err := svc.Create(ctx, payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(article)})
	if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, res.Response.Body) {
		t.Errorf("retry = %+v, %v; want the answer given replayed", again, err)
	}
}

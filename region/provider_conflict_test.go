package region_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/region"
)

// newProviderNode serves a node whose payments go through a real provider
// simulator, and returns the simulator's client.
func newProviderNode(t *testing.T) (*node, *provider.Client) {
	t.Helper()
	st, _ := storetest.New(t)
	client := providertest.Start(t)
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour, LockFor: 30 * time.Second, Provider: client})
	return startNode(t, st, pay, region.Config{}), client
}

// TestProviderKeyConflictIsTerminal: the provider already holds a charge
// under the payment's derived provider key with another amount (another
// party charged it, or another region charged the same merchant reference
// with another amount). Nothing is charged, the payment ends CONFLICT (never
// PENDING for ever), the record answers 409 PROVIDER_KEY_CONFLICT, a retry
// with the key or with a fresh key and the same merchant reference gets the
// same code, and the conflict is counted once.
func TestProviderKeyConflictIsTerminal(t *testing.T) {
	n, client := newProviderNode(t)
	ctx := context.Background()
	id := payments.PaymentID("tenant-a", "acc_1", "invoice-7781")
	if _, err := client.Charge(ctx, provider.ChargeRequest{ProviderKey: payments.ProviderKey(id), AmountMinor: 1200, Currency: "EUR", AccountID: "acc_1"}); err != nil {
		t.Fatal(err)
	}

	first := n.pay("tok-a", "conflict-1", article)
	if first.status != http.StatusConflict || first.code() != payments.ECodeProviderKeyConflict {
		t.Fatalf("first = %d %s, want 409 %s", first.status, first.body, payments.ECodeProviderKeyConflict)
	}
	if got := storetest.Count(t, n.store, `SELECT count(*) FROM payments WHERE payment_id = $1 AND status = 'CONFLICT'`, id); got != 1 {
		t.Errorf("payment %s in CONFLICT: %d rows, want 1", id, got)
	}
	if got := storetest.Count(t, n.store, `SELECT count(*) FROM payments WHERE status = 'PENDING'`); got != 0 {
		t.Errorf("%d payments left PENDING, want 0", got)
	}
	rec, err := n.store.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "conflict-1"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != idem.StatusFailedReplayable || rec.ErrorCode != payments.ECodeProviderKeyConflict {
		t.Errorf("record = %s %s, want %s %s", rec.Status, rec.ErrorCode, idem.StatusFailedReplayable, payments.ECodeProviderKeyConflict)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_provider_key_conflicts_total")); got != 1 {
		t.Errorf("idempotency_provider_key_conflicts_total = %v, want 1", got)
	}

	replay := n.pay("tok-a", "conflict-1", article)
	if replay.status != http.StatusConflict || replay.code() != payments.ECodeProviderKeyConflict || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry with the key = %d %v %s, want a replayed 409 %s", replay.status, replay.header, replay.body, payments.ECodeProviderKeyConflict)
	}
	fresh := n.pay("tok-a", "conflict-2", article)
	if fresh.status != http.StatusConflict || fresh.code() != payments.ECodeProviderKeyConflict {
		t.Errorf("fresh key, same merchant reference = %d %s, want 409 %s", fresh.status, fresh.body, payments.ECodeProviderKeyConflict)
	}
	if again := n.pay("tok-a", "conflict-2", article); again.status != http.StatusConflict || again.code() != payments.ECodeProviderKeyConflict {
		t.Errorf("retry of the fresh key = %d %s, want 409 %s", again.status, again.body, payments.ECodeProviderKeyConflict)
	}
	if got := n.do(http.MethodGet, "/payments/"+id, "tok-a", nil, ""); got.status != http.StatusOK || !containsJSON(got.body, `"status":"CONFLICT"`) {
		t.Errorf("GET /payments/%s = %d %s, want status CONFLICT", id, got.status, got.body)
	}
	if got := testutil.ToFloat64(mustCounter(t, n.reg, "idempotency_provider_key_conflicts_total")); got != 1 {
		t.Errorf("idempotency_provider_key_conflicts_total after retries = %v, want still 1", got)
	}
	c, err := client.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 1 {
		t.Errorf("provider charges = %+v, want only the other party's", c)
	}
}

func containsJSON(body []byte, fragment string) bool {
	return len(body) > 0 && strings.Contains(string(body), fragment)
}

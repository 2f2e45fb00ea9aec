package store_test

import (
	"context"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/store"
)

// TestHandoverMergesIdempotently: the old region's records land in the new
// store once; identical records are recognised, diverging ones reported,
// nothing in the new store overwritten.
func TestHandoverMergesIdempotently(t *testing.T) {
	ctx := context.Background()
	oldStore, _ := storetest.New(t)
	newStore, _ := storetest.New(t)
	complete := func(st *store.Store, key, hash, body string) {
		t.Helper()
		d, err := st.Begin(ctx, beginReq(key, hash))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, d.Lease, completion(body)); err != nil {
			t.Fatal(err)
		}
	}
	complete(oldStore, "only-old", "v1:a", `{"n":1}`)
	complete(oldStore, "both-same", "v1:a", `{"n":2}`)
	complete(newStore, "both-same", "v1:a", `{"n":2}`)
	complete(oldStore, "both-diff", "v1:a", `{"n":3}`)
	complete(newStore, "both-diff", "v1:b", `{"n":4}`)
	if _, err := oldStore.Begin(ctx, beginReq("open", "v1:a")); err != nil {
		t.Fatal(err)
	}

	rep, err := store.Handover(ctx, oldStore, newStore, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 4 || rep.Copied != 2 || rep.Identical != 1 || len(rep.Conflicts) != 1 || rep.Conflicts[0].Scope.Key != "both-diff" {
		t.Fatalf("report = %+v", rep)
	}
	got, err := newStore.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: "both-diff"})
	if err != nil || string(got.Response.Body) != `{"n":4}` {
		t.Errorf("new store's own record was overwritten: %+v %v", got, err)
	}
	if got, err := newStore.Get(ctx, idem.Scope{Tenant: "t1", Operation: "op", Key: "open"}); err != nil || got.Status != idem.StatusInProgress {
		t.Errorf("open record not handed over: %+v %v", got, err)
	}
	again, err := store.Handover(ctx, oldStore, newStore, "t1")
	if err != nil || again.Copied != 0 || again.Identical != 3 || len(again.Conflicts) != 1 {
		t.Errorf("second handover = %+v, %v; want nothing copied", again, err)
	}
}

package engine_test

import (
	"context"
	"fmt"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/memcoord"
)

// An operation registered once by name; every request names it with the
// tenant, the client's key and the command's fingerprint. The records are
// kept by the in-memory coordinator here, as in a unit test; a service
// passes a *store.Store (PostgreSQL or CockroachDB) or a
// *coordclient.Client (a regional node) instead, and nothing else changes.
func Example() {
	ctx := context.Background()

	eng := engine.New(memcoord.New(), engine.Options{})
	err := eng.Register(engine.Operation{
		Name: "create_transfer",
		Execute: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			// Downstream calls carry a.Lease.Token as their fencing token.
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte(`{"transferId":"tr_1"}`)}}, nil
		},
		Recover: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			// Ask downstream what happened to a.Record's transfer.
			return engine.Result{Status: idem.StatusUnknown}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	hashes, err := fingerprint.Hashes("create_transfer", map[string]any{"amount": "10.00", "to": "acc_2"})
	if err != nil {
		panic(err)
	}
	for range 2 {
		ans, err := eng.Do(ctx, engine.Request{Operation: "create_transfer", Tenant: "acme", Key: "order-42", RequestHashes: hashes})
		if err != nil {
			panic(err)
		}
		fmt.Println(ans.Outcome, ans.Response.Status, string(ans.Response.Body), ans.Replayed)
	}
	// Output:
	// execute 201 {"transferId":"tr_1"} false
	// replay 201 {"transferId":"tr_1"} true
}

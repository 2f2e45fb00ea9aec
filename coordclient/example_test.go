package coordclient_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordclient"
	"github.com/idemcoord/idem/fingerprint"
)

// A Go service drives the steps itself against a regional node: begin,
// act under the fencing token, record progress, complete. The retry with
// the same key (a client's, or this service's after a crash) gets the
// stored answer and acts no more. The node here is a stand-in serving the
// coordination API in process (see standin_test.go); in production BaseURL
// is an idemd node's, such as https://eu.idem.example.
func Example() {
	node := startStandInNode()
	defer node.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()

	c := &coordclient.Client{BaseURL: node.URL, Token: "secret-token", HTTP: &http.Client{Transport: transport}}
	ctx := context.Background()
	hashes, err := fingerprint.Hashes("create_transfer", map[string]any{"amount": fingerprint.Number("10.00"), "to": "acc_2"})
	if err != nil {
		panic(err)
	}
	scope := idem.Scope{Operation: "create_transfer", Key: "order-42"} // the tenant is the token's
	for range 2 {
		d, err := c.Begin(ctx, idem.BeginRequest{Scope: scope, RequestHashes: hashes, Owner: "transfers-service",
			LockFor: 30 * time.Second, Window: 24 * time.Hour})
		if err != nil {
			panic(err)
		}
		switch d.Outcome {
		case idem.OutcomeExecute:
			// Call downstream with d.Lease.Token as the fencing token and a
			// key derived from the scope, then store the answer.
			if err := c.Checkpoint(ctx, d.Lease, "TRANSFER_SENT"); err != nil {
				panic(err)
			}
			resp := idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"transferId":"tr_1"}`)}
			if err := c.Complete(ctx, d.Lease, idem.Completion{Response: resp, ResourceType: "transfer", ResourceID: "tr_1"}); err != nil {
				panic(err)
			}
			fmt.Println("executed under fencing token", d.Lease.Token)
		case idem.OutcomeReplay:
			fmt.Println("replayed:", d.Record.Response.Status, string(d.Record.Response.Body))
		default:
			fmt.Println("other outcome:", d.Outcome)
		}
	}
	rec, err := c.Get(ctx, scope)
	if err != nil {
		panic(err)
	}
	fmt.Println("record:", rec.Status, rec.ResourceType, rec.ResourceID, "attempts", rec.Attempts)
	// Output:
	// executed under fencing token 1
	// replayed: 201 {"transferId":"tr_1"}
	// record: COMPLETED transfer tr_1 attempts 1
}

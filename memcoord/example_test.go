package memcoord_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/memcoord"
)

// In a unit test, the coordinator's clock is the test's: an owner that
// crashed holds its key until its lock runs out, and the test moves the
// clock past it instead of waiting. The retry then takes the record over
// under a higher fencing token, and the crashed owner can write no more.
func Example() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	coord := memcoord.New(memcoord.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	req := idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "acme", Operation: "create_transfer", Key: "order-42"},
		RequestHashes: []string{"v2:5e1f"}, HashVersion: 2,
		LockFor: time.Minute, Window: 24 * time.Hour,
	}
	first, err := coord.Begin(ctx, req)
	if err != nil {
		panic(err)
	}
	fmt.Println(first.Outcome, "token", first.Lease.Token, "locked until", first.Record.LockedUntil.Format(time.TimeOnly))
	// The owner crashes. A retry within its lock finds the key in progress.
	retry, err := coord.Begin(ctx, req)
	if err != nil {
		panic(err)
	}
	fmt.Println(retry.Outcome)

	now = now.Add(2 * time.Minute)
	retry, err = coord.Begin(ctx, req)
	if err != nil {
		panic(err)
	}
	fmt.Println(retry.Outcome, "token", retry.Lease.Token, "at checkpoint", retry.Record.Checkpoint)
	err = coord.Complete(ctx, first.Lease, idem.Completion{Response: idem.Response{Status: 201}})
	fmt.Println("crashed owner's late write:", idem.ErrorCode(err))
	// Output:
	// execute token 1 locked until 12:01:00
	// in_progress
	// recover token 2 at checkpoint RECEIVED
	// crashed owner's late write: FENCING_TOKEN_STALE
}

package failover_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/failover"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/routing"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

// TestMoveWaitsForTheRegionThenHandsOver: Move refuses while the region
// has a live node (after its wait, with ErrRegionAlive), moves its tenants
// once the node left, and Handover copies the old store's records of the
// moved tenant into the new home's store, marks the move handed over and
// finishes the old store's outbox, which no node of it is left to do.
func TestMoveWaitsForTheRegionThenHandsOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	member, err := routing.Join(ctx, cli, "eu-west", "eu-west-0", "http://127.0.0.1:1", 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	waited := 0
	if _, err := failover.Move(ctx, cli, "eu-west", "us-east", 300*time.Millisecond, func() { waited++ }); !errors.Is(err, routing.ErrRegionAlive) || waited == 0 {
		t.Fatalf("Move with a live node = %v after %d wait(s), want ErrRegionAlive after waiting", err, waited)
	}
	if err := member.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mv, err := failover.Move(ctx, cli, "eu-west", "us-east", 10*time.Second, nil)
	if err != nil || mv.ServedBy != "us-east" || mv.Epoch == 0 {
		t.Fatalf("Move after the node left = %+v, %v", mv, err)
	}

	src, _ := storetest.New(t)
	dst, _ := storetest.New(t)
	for _, key := range []string{"k1", "k2"} {
		if _, err := src.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: "tenant-a", Operation: "op", Key: key},
			RequestHashes: []string{"v2:h"}, HashVersion: 2, Owner: "eu-west-0", LockFor: time.Minute, Window: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	// eu-west died before publishing a payment's confirmation: nobody
	// else publishes its store's outbox, so the handover does.
	storetest.Exec(t, src, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload)
		VALUES ('evt_1', 'tenant-a', 'pay_1', 'PaymentConfirmed',
		'{"eventId":"evt_1","type":"PaymentConfirmed","paymentId":"pay_1","accountId":"acc_1","amount":"1.00","currency":"EUR"}')`)
	rep, err := failover.Handover(ctx, cli, "eu-west", "us-east", src, dst, nil)
	if err != nil || len(rep.Tenants) != 1 || rep.Tenants[0].Tenant != "tenant-a" || rep.Tenants[0].Copied != 2 {
		t.Fatalf("Handover = %+v, %v; want tenant-a's 2 records copied", rep, err)
	}
	if rep.Outbox.Published != 1 || rep.Outbox.Sent != 1 || rep.Outbox.Left != (outbox.Backlog{}) {
		t.Errorf("Handover's outbox = %+v; want the event published, its receipt sent, nothing left", rep.Outbox)
	}
	if n := storetest.Count(t, src, `SELECT count(*) FROM ledger_entries WHERE source_payment_id = 'pay_1'`); n != 1 {
		t.Errorf("the old store has %d ledger entries of pay_1; want 1", n)
	}
	if _, err := dst.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: "op", Key: "k2"}); err != nil {
		t.Errorf("the new home lacks k2: %v", err)
	}
	moved, found, err := routing.GetRegionMove(ctx, cli, "eu-west")
	if err != nil || !found {
		t.Fatalf("region move: %v, %v", found, err)
	}
	m, err := routing.NewMap(ctx, cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, rm := range m.RegionMoves() {
		if rm.Region == "eu-west" && rm.Epoch == moved.Epoch && !rm.HandedOver {
			t.Error("the move is not marked handed over")
		}
	}
	again, err := failover.Handover(ctx, cli, "eu-west", "us-east", src, dst, nil)
	if err != nil || again.Conflicts != 0 || again.Tenants[0].Identical != 2 {
		t.Errorf("second Handover = %+v, %v; want the records found identical", again, err)
	}
}

// TestConcurrentMovesAllSucceed: operators (or a drill and an operator)
// failing the same dead region over at once race on its key; a loser
// reads again and moves (the region is dead, so the move is allowed), it
// does not fail with the epoch its read saw changed.
func TestConcurrentMovesAllSucceed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	const movers = 8
	errs := make(chan error, movers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range movers {
		wg.Go(func() {
			<-start
			_, err := failover.Move(ctx, cli, "eu-west", "us-east", 10*time.Second, nil)
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a concurrent Move of a dead region failed: %v", err)
		}
	}
	if mv, found, err := routing.GetRegionMove(ctx, cli, "eu-west"); err != nil || !found || mv.ServedBy != "us-east" {
		t.Errorf("eu-west's move = %+v, %v, %v; want served by us-east", mv, found, err)
	}
}

func TestTransient(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	wrap := func(err error) error { return fmt.Errorf("routing: move a -> b: %w", err) }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"request timed out", live, wrap(rpctypes.ErrTimeout), true},
		{"leader lost", live, wrap(rpctypes.ErrTimeoutDueToLeaderFail), true},
		{"no leader", live, wrap(rpctypes.ErrNoLeader), true},
		{"grpc unavailable", live, wrap(status.Error(codes.Unavailable, "connection refused")), true},
		{"deadline of the request", live, wrap(context.DeadlineExceeded), true},
		{"region alive", live, wrap(routing.ErrRegionAlive), false},
		{"permission denied", live, wrap(rpctypes.ErrPermissionDenied), false},
		{"caller gave up", ended, wrap(rpctypes.ErrTimeout), false},
		{"nil", live, nil, false},
	} {
		if got := failover.Transient(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestHandoverLeavesAReturnedRegionsOutbox: when the old region has a live
// node again (it came back after a partition), its own nodes work its
// outbox, and the handover leaves it to them: a second worker beside them
// could send a receipt twice.
func TestHandoverLeavesAReturnedRegionsOutbox(t *testing.T) {
	ctx := context.Background()
	cli := etcdtest.Start(t).Client(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	if _, err := failover.Move(ctx, cli, "eu-west", "us-east", 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	member, err := routing.Join(ctx, cli, "eu-west", "eu-west-0", "http://127.0.0.1:1", 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = member.Close(context.Background()) })
	src, _ := storetest.New(t)
	dst, _ := storetest.New(t)
	storetest.Exec(t, src, `INSERT INTO outbox_events (event_id, tenant_id, aggregate_id, event_type, payload)
		VALUES ('evt_1', 'tenant-a', 'pay_1', 'PaymentConfirmed',
		'{"eventId":"evt_1","type":"PaymentConfirmed","paymentId":"pay_1","accountId":"acc_1","amount":"1.00","currency":"EUR"}')`)
	rep, err := failover.Handover(ctx, cli, "eu-west", "us-east", src, dst, nil)
	if err != nil || !rep.OutboxLeftToRegion || rep.Outbox.Published != 0 {
		t.Fatalf("Handover with eu-west back = outbox %+v, left to region %v, %v; want the outbox left to eu-west's nodes", rep.Outbox, rep.OutboxLeftToRegion, err)
	}
	if n := storetest.Count(t, src, `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`); n != 1 {
		t.Errorf("unpublished events in eu-west's store = %d, want 1 (left to its nodes)", n)
	}
}

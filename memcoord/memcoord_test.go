package memcoord_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordtest"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/fakeclock"
	"github.com/idemcoord/idem/memcoord"
)

var start = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestContract: the in-memory coordinator passes the store's contract
// suite, its clock moved on by the suite's Age.
func TestContract(t *testing.T) {
	coordtest.Run(t, func(t *testing.T) coordtest.Target {
		clock := fakeclock.NewManual(start)
		return coordtest.Target{
			Coordinator: memcoord.New(memcoord.WithClock(clock.Now)),
			Age:         func(_ idem.Scope, d time.Duration) { clock.Advance(d) },
		}
	})
}

// TestSharedCoordinator: one Coordinator for every check passes too (the
// suite's keys differ per check).
func TestSharedCoordinator(t *testing.T) {
	clock := fakeclock.NewManual(start)
	c := memcoord.New(memcoord.WithClock(clock.Now))
	coordtest.Run(t, func(*testing.T) coordtest.Target {
		return coordtest.Target{Coordinator: c, Age: func(_ idem.Scope, d time.Duration) { clock.Advance(d) }}
	})
}

// TestSystemClock: without WithClock, records are timed by time.Now; the
// checks that need time to pass are skipped.
func TestSystemClock(t *testing.T) {
	coordtest.Run(t, func(*testing.T) coordtest.Target {
		return coordtest.Target{Coordinator: memcoord.New()}
	})
	c := memcoord.New()
	before := time.Now()
	d, err := c.Begin(context.Background(), begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	if rec := d.Record; rec.CreatedAt.Before(before.Round(0)) || rec.CreatedAt.After(time.Now()) {
		t.Errorf("created at %v, want between %v and now", rec.CreatedAt, before)
	}
}

func begin(key string) idem.BeginRequest {
	return idem.BeginRequest{Scope: idem.Scope{Tenant: "t", Operation: "op", Key: key}, RequestHashes: []string{"v2:aa"},
		HashVersion: 2, Owner: "me", HomeRegion: "eu-west", LockFor: time.Minute, Window: time.Hour}
}

// TestRecordTimes: a record's times are the clock's, its home region the
// request's.
func TestRecordTimes(t *testing.T) {
	clock := fakeclock.NewManual(start)
	c := memcoord.New(memcoord.WithClock(clock.Now))
	ctx := context.Background()
	d, err := c.Begin(ctx, begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	rec := d.Record
	if !rec.CreatedAt.Equal(start) || !rec.UpdatedAt.Equal(start) || !rec.LockedUntil.Equal(start.Add(time.Minute)) ||
		!rec.ExpiresAt.Equal(start.Add(time.Hour)) || rec.HomeRegion != "eu-west" {
		t.Errorf("record = %+v; want created %v, locked one minute, window one hour, home eu-west", rec, start)
	}
	clock.Advance(time.Second)
	if err := c.Checkpoint(ctx, d.Lease, "SENT"); err != nil {
		t.Fatal(err)
	}
	rec, err = c.Get(ctx, d.Lease.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.UpdatedAt.Equal(start.Add(time.Second)) || !rec.LockedUntil.Equal(start.Add(time.Minute)) {
		t.Errorf("after a checkpoint: updated %v, locked until %v; want %v and the lock unchanged", rec.UpdatedAt, rec.LockedUntil, start.Add(time.Second))
	}
}

// TestByReference: a completion by reference keeps status, schema version
// and resource, not headers or body.
func TestByReference(t *testing.T) {
	c := memcoord.New()
	ctx := context.Background()
	d, err := c.Begin(ctx, begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	resp := idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{}`), SchemaVersion: "v2", ByReference: true}
	if err := c.Complete(ctx, d.Lease, idem.Completion{Response: resp, ResourceType: "transfer", ResourceID: "tr_1"}); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Get(ctx, d.Lease.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if r := rec.Response; r == nil || !r.ByReference || r.Status != 201 || r.SchemaVersion != "v2" || r.Headers != nil || r.Body != nil || rec.ResourceID != "tr_1" {
		t.Errorf("record = %+v, response %+v; want a reference without headers or body", rec, rec.Response)
	}
}

// TestListStale: records nobody works on, oldest update first, up to the
// limit; settled, held and other operations' records are not listed.
func TestListStale(t *testing.T) {
	clock := fakeclock.NewManual(start)
	c := memcoord.New(memcoord.WithClock(clock.Now))
	ctx := context.Background()
	leases := map[string]idem.Lease{}
	for _, key := range []string{"stale-1", "stale-2", "unknown", "completed", "held"} {
		d, err := c.Begin(ctx, begin(key))
		if err != nil {
			t.Fatal(err)
		}
		leases[key] = d.Lease
		clock.Advance(time.Second)
	}
	other := begin("stale-other-op")
	other.Operation = "other"
	if _, err := c.Begin(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, leases["completed"], idem.Completion{Response: idem.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Fail(ctx, leases["unknown"], idem.Failure{Status: idem.StatusUnknown}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute - time.Second) // stale-1, stale-2 and unknown's locks have run out; held's not yet
	if err := c.Checkpoint(ctx, leases["held"], "STILL_HERE"); err != nil {
		t.Fatal(err)
	}
	got, err := c.ListStale(ctx, "op", 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, rec := range got {
		keys = append(keys, rec.Key)
	}
	want := []string{"stale-1", "stale-2", "unknown"}
	if len(keys) != len(want) || keys[0] != want[0] || keys[1] != want[1] || keys[2] != want[2] {
		t.Errorf("ListStale = %v, want %v", keys, want)
	}
	if got, _ := c.ListStale(ctx, "op", 1); len(got) != 1 || got[0].Key != "stale-1" {
		t.Errorf("ListStale with limit 1 = %d records, want stale-1", len(got))
	}
}

// TestCancelled: every method refuses a done context.
func TestCancelled(t *testing.T) {
	c := memcoord.New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Begin(ctx, begin("k")); !errors.Is(err, context.Canceled) {
		t.Errorf("Begin = %v", err)
	}
	if _, err := c.Get(ctx, begin("k").Scope); !errors.Is(err, context.Canceled) {
		t.Errorf("Get = %v", err)
	}
	if _, err := c.ListStale(ctx, "op", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("ListStale = %v", err)
	}
}

// lossy is a Coordinator whose first Begin's answer is lost after the
// claim is made, as a COMMIT whose answer never arrives.
type lossy struct {
	*memcoord.Coordinator
	lost atomic.Bool
}

var errAnswerLost = errors.New("the answer of Begin was lost")

func (l *lossy) Begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	d, err := l.Coordinator.Begin(ctx, req)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return idem.Decision{}, errAnswerLost
	}
	return d, err
}

// TestEngineAfterALostAnswer: the engine attempts a request again after a
// Begin whose answer was lost (Request.RetryOn) under the same claim id,
// and memcoord hands that claim its record back: the operation executes
// once and the request is answered by it, not told its own key is in
// progress.
func TestEngineAfterALostAnswer(t *testing.T) {
	coord := &lossy{Coordinator: memcoord.New()}
	eng := engine.New(coord, engine.Options{})
	var executions atomic.Int32
	if err := eng.Register(engine.Operation{
		Name: "create_transfer",
		Execute: func(context.Context, *engine.Attempt) (engine.Result, error) {
			executions.Add(1)
			return engine.Result{Response: idem.Response{Status: 201, Body: []byte(`{"transferId":"tr_1"}`)}}, nil
		},
	}); err != nil {
		t.Fatal(err)
	}
	req := engine.Request{Operation: "create_transfer", Tenant: "acme", Key: "order-42", RequestHashes: []string{"v2:5e1f"},
		RetryOn: func(err error) bool { return errors.Is(err, errAnswerLost) }}
	ans, err := eng.Do(t.Context(), req)
	if err != nil || ans.Outcome != idem.OutcomeExecute || ans.Response.Status != 201 || ans.Replayed {
		t.Fatalf("Do after a lost answer = %+v, %v; want the request's own execution", ans, err)
	}
	if !coord.lost.Load() {
		t.Fatal("no answer was lost")
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
	ans, err = eng.Do(t.Context(), req)
	if err != nil || !ans.Replayed || executions.Load() != 1 {
		t.Errorf("the client's retry = %+v, %v (executions %d); want a replay", ans, err, executions.Load())
	}
}

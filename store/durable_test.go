package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
)

// TestAnswersWaitForStandbys: on a primary with synchronous standbys, a
// request is answered from a record only once the standbys have what was
// read. Here the standby named in synchronous_standby_names never
// connects (as for a primary cut off from its standbys), so a retry of a
// completed key is not answered, neither as a replay nor as a conflict:
// its read waits, as a write would, until the request gives up. With the
// setting empty the same retry replays.
func TestAnswersWaitForStandbys(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	d, err := st.Begin(ctx, beginReq("dur-1", "v1:a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, d.Lease, completion(`{"ok":1}`)); err != nil {
		t.Fatal(err)
	}
	storetest.SetSyncStandbys(t, st, "ghost")
	t.Cleanup(func() { storetest.SetSyncStandbys(t, st, "") })

	for _, tc := range []struct {
		name   string
		answer func(context.Context) (idem.Decision, error)
	}{
		{"claim", func(ctx context.Context) (idem.Decision, error) { return st.Begin(ctx, beginReq("dur-1", "v1:a")) }},
		{"fast-path read", func(ctx context.Context) (idem.Decision, error) {
			d, _, err := st.ReadSettled(ctx, beginReq("dur-1", "v1:a"))
			return d, err
		}},
		{"conflict", func(ctx context.Context) (idem.Decision, error) { return st.Begin(ctx, beginReq("dur-1", "v1:b")) }},
	} {
		// The deadline is how long the request waits, not a timing
		// asserted: the read must not answer at all.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		got, err := tc.answer(wctx)
		cancel()
		if got.Outcome == idem.OutcomeReplay || got.Outcome == idem.OutcomeConflict {
			t.Errorf("%s with a standby that never has the record = %v, %v; want no answer", tc.name, got.Outcome, err)
		}
	}

	storetest.SetSyncStandbys(t, st, "")
	if got, err := st.Begin(ctx, beginReq("dur-1", "v1:a")); err != nil || got.Outcome != idem.OutcomeReplay {
		t.Errorf("replay without synchronous standbys = %v, %v; want a replay", got.Outcome, err)
	}
}

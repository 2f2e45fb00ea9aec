package idem_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 5, 7, 10, 45, 0, 0, time.UTC)
	future, past := now.Add(time.Minute), now.Add(-time.Minute)
	rec := func(status idem.Status, locked *time.Time, expires time.Time) *idem.Record {
		return &idem.Record{RequestHash: "v1:a", Status: status, LockedUntil: locked, ExpiresAt: expires}
	}
	for _, tc := range []struct {
		name   string
		rec    *idem.Record
		hashes []string
		want   idem.Outcome
	}{
		{"completed same command", rec(idem.StatusCompleted, nil, future), []string{"v1:a"}, idem.OutcomeReplay},
		{"completed different command", rec(idem.StatusCompleted, nil, future), []string{"v1:b"}, idem.OutcomeConflict},
		{"matched under an older hash version", rec(idem.StatusCompleted, nil, future), []string{"v2:x", "v1:a"}, idem.OutcomeReplay},
		{"replayable failure", rec(idem.StatusFailedReplayable, nil, future), []string{"v1:a"}, idem.OutcomeReplay},
		{"retryable failure", rec(idem.StatusFailedRetryable, nil, future), []string{"v1:a"}, idem.OutcomeRecover},
		{"fresh in progress", rec(idem.StatusInProgress, &future, future), []string{"v1:a"}, idem.OutcomeInProgress},
		{"stale in progress (the article's 10:45 case)", rec(idem.StatusInProgress, &past, future), []string{"v1:a"}, idem.OutcomeRecover},
		{"in progress, different command", rec(idem.StatusInProgress, &future, future), []string{"v1:b"}, idem.OutcomeConflict},
		{"unknown, unlocked", rec(idem.StatusUnknown, nil, future), []string{"v1:a"}, idem.OutcomeRecover},
		{"unknown, being recovered", rec(idem.StatusUnknown, &future, future), []string{"v1:a"}, idem.OutcomeInProgress},
		{"completed past window", rec(idem.StatusCompleted, nil, past), []string{"v1:b"}, idem.OutcomeExpired},
		{"expired status", rec(idem.StatusExpired, nil, past), []string{"v1:a"}, idem.OutcomeExpired},
		{"unknown past window is not forgotten", rec(idem.StatusUnknown, nil, past), []string{"v1:a"}, idem.OutcomeRecover},
		{"in progress past window is not forgotten", rec(idem.StatusInProgress, &future, past), []string{"v1:a"}, idem.OutcomeInProgress},
		{"expires exactly now", rec(idem.StatusCompleted, nil, now), []string{"v1:a"}, idem.OutcomeExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := idem.Decide(tc.rec, tc.hashes, now); got != tc.want {
				t.Errorf("Decide = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDecideOwnClaim(t *testing.T) {
	rec := func(status idem.Status, attempts int, cp idem.Checkpoint) *idem.Record {
		return &idem.Record{Status: status, Attempts: attempts, Checkpoint: cp}
	}
	for _, tc := range []struct {
		name          string
		rec           *idem.Record
		claim, holder string
		start         idem.Checkpoint
		want          idem.Outcome
		ok            bool
	}{
		{"as its insert left it", rec(idem.StatusInProgress, 1, idem.CheckpointReceived), "c1", "c1", idem.CheckpointReceived, idem.OutcomeExecute, true},
		{"inserted at another start", rec(idem.StatusInProgress, 1, "provider-called"), "c1", "c1", "provider-called", idem.OutcomeExecute, true},
		{"its owner moved on", rec(idem.StatusInProgress, 1, "provider-called"), "c1", "c1", idem.CheckpointReceived, idem.OutcomeRecover, true},
		{"a takeover's record", rec(idem.StatusInProgress, 2, idem.CheckpointReceived), "c1", "c1", idem.CheckpointReceived, idem.OutcomeRecover, true},
		{"another claim's record", rec(idem.StatusInProgress, 1, idem.CheckpointReceived), "c1", "c2", idem.CheckpointReceived, 0, false},
		{"a request without a claim id", rec(idem.StatusInProgress, 1, idem.CheckpointReceived), "", "", idem.CheckpointReceived, 0, false},
		{"a record without one", rec(idem.StatusInProgress, 1, idem.CheckpointReceived), "c1", "", idem.CheckpointReceived, 0, false},
		{"settled since", rec(idem.StatusCompleted, 1, idem.CheckpointCompleted), "c1", "c1", idem.CheckpointReceived, 0, false},
		{"handed to recovery since", rec(idem.StatusUnknown, 1, idem.CheckpointReceived), "c1", "c1", idem.CheckpointReceived, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := idem.DecideOwnClaim(tc.rec, tc.claim, tc.holder, tc.start)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("DecideOwnClaim = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestValidKey(t *testing.T) {
	for key, want := range map[string]bool{
		"abc-123": true, "a": true, string(make([]byte, 0)): false, "with space": false,
		"tab\t": false, "ünïcode": false, "~!@#$%^&*()": true, "\x7f": false,
		// Dot segments a URL path would lose; longer runs of dots are keys.
		".": false, "..": false, "...": true, "a/..": true, "%2E": true, "./a": true,
	} {
		if got := idem.ValidKey(key); got != want {
			t.Errorf("ValidKey(%q) = %v, want %v", key, got, want)
		}
	}
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'k'
	}
	if idem.ValidKey(string(long)) || !idem.ValidKey(string(long[:255])) {
		t.Error("ValidKey length bound is not 255")
	}
}

func TestValidOperation(t *testing.T) {
	for op, want := range map[string]bool{
		"charge": true, "ship.order": true, "a_b-1": true, "...": true, strings.Repeat("o", idem.MaxOperationLen): true,
		"": false, "Charge": false, "a/b": false, "a b": false, strings.Repeat("o", idem.MaxOperationLen+1): false,
		".": false, "..": false,
	} {
		if got := idem.ValidOperation(op); got != want {
			t.Errorf("ValidOperation(%q) = %v, want %v", op, got, want)
		}
	}
}

func TestErrorCodes(t *testing.T) {
	err := idem.Errorf(idem.ECodeKeyReused, "reused %d", 1)
	if idem.ErrorCode(err) != idem.ECodeKeyReused || idem.ErrorMessage(err) != "reused 1" {
		t.Errorf("code/message = %q/%q", idem.ErrorCode(err), idem.ErrorMessage(err))
	}
	if idem.ErrorCode(errPlain{}) != idem.ECodeInternal || idem.ErrorMessage(errPlain{}) != "Internal error." {
		t.Error("a plain error must map to INTERNAL with a generic message")
	}
	if idem.ErrorCode(nil) != "" {
		t.Error("nil has a code")
	}
}

type errPlain struct{}

func (errPlain) Error() string { return "secret detail" }

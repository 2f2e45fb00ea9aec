// Package coordtest is the contract suite of [idem.Coordinator]: [Run]
// checks that an implementation claims, decides, fences, takes over and
// expires records as the PostgreSQL store (package store) does. The
// repository runs it against the store, against coordclient talking to a
// regional node, and against the in-memory coordinator (package memcoord);
// a team with a Coordinator of its own (a wrapper that adds tracing or
// caching, an adapter to another database) runs it the same way:
//
//	func TestCoordinator(t *testing.T) {
//		coordtest.Run(t, func(t *testing.T) coordtest.Target {
//			clock := newManualClock() // a clock the test moves on
//			c := memcoord.New(memcoord.WithClock(clock.Now))
//			return coordtest.Target{
//				Coordinator: c,
//				Age:         func(_ idem.Scope, d time.Duration) { clock.Advance(d) },
//			}
//		})
//	}
//
// What the suite holds an implementation to, one subtest each: a free key
// is claimed by one request (OutcomeExecute, fencing token above zero,
// IN_PROGRESS at RECEIVED or at BeginRequest.StartAt), even when many
// claim it at once; a claim sent again under its BeginRequest.ClaimID gets
// its own lease back while its record is open; an existing record answers
// as [idem.Decide] says (in progress, conflict, replay with the stored
// response, under any hash version the request carries); Checkpoint,
// Complete and Fail write only under the record's current token and while
// it is open, and fail with
// [idem.ErrFenced] otherwise; a FAILED_RETRYABLE, UNKNOWN or stale record
// is taken over once, under a higher token, keeping its checkpoint; with
// BeginRequest.ExternalFencing a takeover waits for the caller's external
// token and takes it only if it is higher; a settled record past its
// window is reused as a new generation, an unsettled one never; Get
// returns copies, or an error matching [idem.ErrRecordNotFound]; and
// invalid requests fail with the codes the store uses.
//
// The suite uses scopes under [Tenant] (and [OtherTenant]), operations
// [Operation] and [OtherOperation], and keys that differ for every check,
// with BeginRequest.LockFor one minute and Window one hour. Importing it
// pulls in package testing: import it from _test.go files only.
package coordtest

import (
	"context"
	"testing"
	"time"

	"github.com/idemcoord/idem"
)

// The scopes the suite's records are made in. A coordinator that serves
// declared operations only (a regional node behind coordclient.Client) must
// declare Operation and OtherOperation.
const (
	Tenant         = "coordtest-tenant"
	OtherTenant    = "coordtest-other-tenant"
	Operation      = "coordtest"
	OtherOperation = "coordtest.other"
)

// Target is one Coordinator under test, and what Run needs to know of it.
type Target struct {
	// Coordinator is the implementation under test. It must hold no record
	// of the keys the suite uses; open may return the same Coordinator for
	// every check of one Run, since each check uses keys of its own.
	Coordinator idem.Coordinator
	// Age makes d pass for scope's record on the coordinator's clock: its
	// lock and window are d nearer their end, or past it, as if the record
	// had been written d earlier. It may age other records too (a fake
	// clock moved on by d does). It reports its own failures through the
	// t given to open. Nil skips the checks that need time to pass (stale
	// takeovers, expiry); a coordinator whose clock cannot be moved can
	// still pass everything else.
	Age func(scope idem.Scope, d time.Duration)
	// OneTenant says that the coordinator serves one tenant whatever
	// BeginRequest.Tenant and Scope.Tenant say (coordclient.Client: the
	// tenant is its token's): the checks that two tenants' records are
	// separate, and that an empty tenant is refused, are skipped.
	OneTenant bool
	// NoExternalFencing says that the coordinator does not take
	// BeginRequest.ExternalFencing and FencingToken (coordclient.Client:
	// the coordination API takes no external token): the check of
	// takeovers under an external token is skipped.
	NoExternalFencing bool
	// IgnoresStartAt says that the coordinator inserts a free key's record
	// at RECEIVED whatever BeginRequest.StartAt says, as the interface
	// allows: the check accepts either checkpoint, and a StartAt the store
	// would refuse is not checked.
	IgnoresStartAt bool
	// IgnoresClaimID says that the coordinator ignores
	// BeginRequest.ClaimID, as one without unknown commits may: the check
	// that a claim sent again gets its lease back is skipped.
	IgnoresClaimID bool
}

// Suite durations: every Begin of the suite asks for them.
const (
	lockFor = time.Minute
	window  = time.Hour
	// slack is how far a record's lock and window ends may be from its
	// write's time plus LockFor or Window (a remote coordinator rounds
	// them to seconds).
	slack = time.Second
)

// check is one subtest of Run.
type check struct {
	name string
	// needs says what the check needs of the Target beyond a Coordinator:
	// "" for nothing.
	needs need
	run   func(e *env)
}

type need int

const (
	needNothing need = iota
	needAge
	needExternalFencing
	needTenants
	needClaimID
)

// checks are Run's subtests, in order.
var checks = []check{
	{"claim a free key", needNothing, checkClaim},
	{"claim starts at StartAt", needNothing, checkStartAt},
	{"held key answers in progress or conflict", needNothing, checkInProgress},
	{"concurrent claims grant one", needNothing, checkConcurrentClaims},
	{"a claim sent again gets its lease back", needClaimID, checkClaimSentAgain},
	{"complete and replay", needNothing, checkCompleteReplay},
	{"replay under an older hash version", needNothing, checkHashVersions},
	{"checkpoint", needNothing, checkCheckpoint},
	{"writes are fenced", needNothing, checkFenced},
	{"replayable failure", needNothing, checkFailReplayable},
	{"retryable failure is taken over", needNothing, checkFailRetryable},
	{"unknown outcome is taken over", needNothing, checkFailUnknown},
	{"fail needs a failure status", needNothing, checkFailStatus},
	{"stale lock is taken over", needAge, checkStale},
	{"concurrent takeovers grant one", needAge, checkConcurrentTakeovers},
	{"takeover under an external token", needExternalFencing, checkExternalFencing},
	{"settled record expires", needAge, checkExpiry},
	{"unsettled record never expires", needAge, checkNoExpiry},
	{"get returns copies", needNothing, checkGet},
	{"operations are separate", needNothing, checkOperations},
	{"tenants are separate", needTenants, checkTenants},
	{"invalid requests", needNothing, checkInvalid},
	{"cancelled context", needNothing, checkCancelled},
}

// Run runs the contract suite, one subtest per check, calling open at the
// start of each (with the subtest's t) for the Coordinator to check.
// Checks run one after another, never in parallel.
func Run(t *testing.T, open func(t *testing.T) Target) {
	t.Helper()
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			tg := open(t)
			if tg.Coordinator == nil {
				t.Fatal("coordtest: open returned a Target without a Coordinator")
			}
			switch {
			case (c.needs == needAge || c.needs == needExternalFencing) && tg.Age == nil:
				t.Skip("coordtest: the Target cannot make time pass (Age is nil)")
			case c.needs == needExternalFencing && tg.NoExternalFencing:
				t.Skip("coordtest: the Target takes no external fencing token")
			case c.needs == needTenants && tg.OneTenant:
				t.Skip("coordtest: the Target serves one tenant")
			case c.needs == needClaimID && tg.IgnoresClaimID:
				t.Skip("coordtest: the Target ignores BeginRequest.ClaimID")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			c.run(&env{t: t, tg: tg, c: tg.Coordinator, ctx: ctx, prefix: keyPrefix(c.name)})
		})
	}
}

// keyPrefix makes a check's name a key prefix (visible ASCII, no spaces).
func keyPrefix(name string) string {
	b := []byte("coordtest-" + name)
	for i, c := range b {
		if c == ' ' {
			b[i] = '-'
		}
	}
	return string(b)
}

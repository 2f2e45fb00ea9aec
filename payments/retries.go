package payments

import "github.com/idemcoord/idem/internal/share"

// retryShare estimates which share of a node's recent create_payment
// claims found their key settled (a retry of a request that was answered,
// or a key reused for another command), and chooses from it how the next
// claim starts.
//
// Both ways answer alike; they differ in cost. Reading first costs a fresh
// key a round trip before its claim, and answers a retry from one read
// with no insert attempted. Claiming first costs a fresh key nothing more,
// and answers a retry from the claim's own round trip (claimOrReplayPayment:
// an insert that finds the key taken, and the read). At normal times fresh
// keys are most of the traffic; during an incident retries are, and then
// the read is the cheaper of the two (docs/benchmarks.md, "Claim or
// replay").
//
// The estimate is internal/share's, over about its last share.Span
// claims. The zero value starts from no retries.
type retryShare struct {
	share.Share
}

// readFirstAbove is the share of retries above which a claim reads first:
// where the two orders cost the same in the store and replay suites at
// concurrency 8 (0.59: a replay through the claim costs 1.8 reads, a read
// before a fresh claim a third of the claim; docs/benchmarks.md, "Claim or
// replay"). readInClaimAbove is the share of retries above which a claim
// that goes alone reads the record of a key it finds taken in the same
// statement (claimOrReplayPayment). At or below it, the claim is the plain
// one (store.ClaimOrReadGroup.ExecExpectFree): a fresh key's claim costs
// the server about a fifth less (the read's plan is not started), and a
// key found taken is read after it by the fast path's read, a round trip
// more. A tenth keeps the second round trip for the traffic of normal
// times, when retries are few, and goes back to the one statement well
// before they are many (docs/benchmarks.md, "A plain claim while retries
// are rare").
const (
	readFirstAbove   = 0.6
	readInClaimAbove = 0.1
)

// observe records one claim's outcome: settled says its key had a settled
// record.
func (r *retryShare) observe(settled bool) { r.Observe(settled) }

// readFirst reports whether the next claim should read first.
func (r *retryShare) readFirst() bool { return r.Above(readFirstAbove) }

// readInClaim reports whether the next claim that goes alone should read
// a key it finds taken in the same statement.
func (r *retryShare) readInClaim() bool { return r.Above(readInClaimAbove) }

// share is the estimate, between 0 and 1.
func (r *retryShare) share() float64 { return r.Value() }

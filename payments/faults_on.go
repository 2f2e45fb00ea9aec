//go:build failpoints

package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/failpoint"
	"github.com/idemcoord/idem/store"
)

// Faults are the fault-injection settings of a Service. They exist only in
// builds with -tags failpoints (release builds have an empty Faults), so a
// release binary cannot pause at a failpoint or run a broken engine.
type Faults struct {
	// Failpoints pauses the operation at named points (tests, chaos runs).
	Failpoints *failpoint.Set
	// Break selects a deliberately broken engine for the chaos harness's
	// honesty checks (BreakFindThenInsert, BreakNoFencing, BreakRawBodyHash).
	// Empty: the real engine.
	Break string
}

// Deliberately broken modes (Faults.Break). They exist so that the chaos
// harness can prove it catches the failures the product guards against; a
// green report means something only if a broken engine turns it red. Never
// use them outside chaos runs and their tests.
const (
	// BreakFindThenInsert: the claim reads the record, then inserts (no
	// atomic insert-first), and the payment id is drawn at random, as a
	// naive implementation would do.
	BreakFindThenInsert = "find-then-insert"
	// BreakNoFencing: recovery owners ignore fencing: no etcd lock, store
	// writes unconditional (even over a finished record), no token sent to
	// the provider.
	BreakNoFencing = "no-fencing"
	// BreakRawBodyHash: the request hash is SHA-256 of the raw body bytes,
	// so a re-serialised retry of the same command looks like a different
	// command.
	BreakRawBodyHash = "raw-body-hash"
)

func (f Faults) validate() error {
	switch f.Break {
	case "", BreakFindThenInsert, BreakNoFencing, BreakRawBodyHash:
		return nil
	}
	return fmt.Errorf("payments: unknown break mode %q (want %s, %s or %s)", f.Break, BreakFindThenInsert, BreakNoFencing, BreakRawBodyHash)
}

// failpoint runs failpoint name's action, if it is active.
func (s *Service) failpoint(ctx context.Context, name string) {
	s.cfg.Failpoints.Eval(ctx, name)
}

// requestHashes are the hashes a request is claimed with: under
// BreakRawBodyHash, the raw body's instead of the command's.
func (s *Service) requestHashes(body []byte, hashes []string) []string {
	if s.cfg.Break != BreakRawBodyHash {
		return hashes
	}
	sum := sha256.Sum256(body)
	return []string{"raw:" + hex.EncodeToString(sum[:])}
}

// externalFencing reports whether owners fence through the Locker: not
// under BreakNoFencing.
func (s *Service) externalFencing() bool {
	return s.cfg.Locker != nil && s.cfg.Break != BreakNoFencing
}

// claimFunc is the call's claim: under BreakFindThenInsert, the naive one.
func (c *createCall) claimFunc() engine.ClaimFunc {
	if c.s.cfg.Break != BreakFindThenInsert {
		return c.claim
	}
	return c.claimFindThenInsert
}

// claimFindThenInsert is the naive claim: look for a record, and if there
// is none, create a payment with a fresh random id and write the record
// without checking whether someone else claimed the key in between.
func (c *createCall) claimFindThenInsert(ctx context.Context, begin idem.BeginRequest) (engine.Claim, error) {
	s := c.s
	if _, err := s.store.Get(ctx, begin.Scope); err == nil {
		c.uncertain = false
		return c.claim(ctx, begin)
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	p, ev := s.newPayment(begin.Scope, c.cmd)
	p.ID = "pay_" + hex.EncodeToString(b)
	p.ProviderKey = ProviderKey(p.ID)
	ev.ID, ev.AggregateID = "evt_"+p.ID+"_created", p.ID
	var done engine.Result
	err := s.store.ExecTx(ctx, func(tx pgx.Tx) error {
		if err := InsertPaymentOnly(ctx, tx, p, ev); err != nil {
			return err
		}
		completion, err := s.completion(ctx, tx, p)
		if err != nil {
			return err
		}
		if err := store.UpsertCompleted(ctx, tx, begin, completion); err != nil {
			return fmt.Errorf("payments: naive record write: %w", err)
		}
		done = engine.Result{Stored: true, Status: idem.StatusCompleted, Response: completion.Response}
		return nil
	})
	if errors.Is(err, ErrDuplicateMerchantReference) {
		// The naive engine reports the constraint violation as is.
		return engine.Claim{}, idem.Errorf(ECodeDuplicateMerchantRef, "A payment with this merchant reference already exists for the account.")
	}
	if err != nil {
		return engine.Claim{}, err
	}
	return engine.Claim{Decision: idem.Decision{Outcome: idem.OutcomeExecute}, Done: &done}, nil
}

// unfenced returns the lease an owner writes with: under BreakNoFencing its
// writes skip every fencing check.
func (s *Service) unfenced(l idem.Lease) idem.Lease {
	if s.cfg.Break == BreakNoFencing {
		l.Token = store.UnfencedToken
	}
	return l
}

package chaos

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemcoord/idem/provider"
)

// Check names, as they appear in reports.
const (
	CheckFaults             = "faults-healthy"
	CheckSingleCharge       = "single-charge"
	CheckSinglePayment      = "single-payment"
	CheckSingleLedgerEntry  = "single-ledger-entry"
	CheckSingleEmail        = "single-email"
	CheckAckedNotLost       = "acknowledged-not-lost"
	CheckAnswerMatches      = "answer-matches-payment"
	CheckIdenticalAnswers   = "identical-answers"
	CheckReusedNotExecuted  = "reused-key-not-executed"
	CheckNoFalseKeyReuse    = "no-false-key-reuse"
	CheckDuplicateReference = "duplicate-reference"
	CheckNoStuckRecords     = "no-stuck-records"
	CheckNoInternalErrors   = "no-internal-errors"
	CheckSweepReplays       = "replayable-after-heal"
	CheckLinearizable       = "linearizable"
	// CheckDrillBounds holds a failover-type scenario's drill figures to
	// their bounds (skipped elsewhere).
	CheckDrillBounds = "drill-bounds"
	// CheckSidecarSingleExecution and CheckSidecarIdenticalAnswers look at
	// the sidecar scenario's route (skipped elsewhere).
	CheckSidecarSingleExecution  = "sidecar-single-execution"
	CheckSidecarIdenticalAnswers = "sidecar-identical-answers"
	// CheckGRPCSingleExecution and CheckGRPCAnswers look at the gRPC
	// scenario's calls (skipped elsewhere).
	CheckGRPCSingleExecution = "grpc-single-execution"
	CheckGRPCAnswers         = "grpc-identical-answers"
)

// CheckInfo names and describes a check.
type CheckInfo struct{ Name, Description string }

// check is one row of the checks' table: its name, what it holds, and the
// function that judges a run (nil for drill-bounds, which the run computes
// from its drill figures).
type check struct {
	name        string
	run         func(*checkInput) CheckResult
	description string
}

// checkTable is every check, in report order: the one place a check is
// declared.
func checkTable() []check {
	return []check{
		{CheckFaults, checkFaults,
			"every fault found the cluster healthy, was injected and healed, and the cluster was healthy again after it"},
		{CheckSingleCharge, checkSingleCharge,
			"the provider charged each provider key at most once, and each merchant reference through at most one payment"},
		{CheckSinglePayment, checkSinglePayment,
			"at most one payment (derived payment id) per tenant, account and merchant reference, over every region's store"},
		{CheckSingleLedgerEntry, checkSingleLedger,
			"at most one ledger entry per entry type and payment, over every region's store"},
		{CheckSingleEmail, checkSingleEmail,
			"at most one receipt notification and one sent email per payment, over every region's store"},
		{CheckAckedNotLost, checkAckedNotLost,
			"every acknowledged payment (201) exists in a store and, with a provider, was charged exactly once"},
		{CheckAnswerMatches, checkAnswerMatches,
			"every 201 describes its payment as stored: id, account, amount, currency, merchant reference, channel, and (schema v3) createdAt = the payment's creation time"},
		{CheckIdenticalAnswers, checkIdenticalAnswers,
			"every final answer for one key (201, 402, 409 duplicate reference) is byte-identical"},
		{CheckReusedNotExecuted, checkReusedNotExecuted,
			"a key reused with a different command never executed it: 409 key reused, and its amount is in no payment"},
		{CheckNoFalseKeyReuse, checkNoFalseKeyReuse,
			"the same command retried (re-serialised, another region) never got 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"},
		{CheckDuplicateReference, checkDuplicateReference,
			"a command resent with fresh keys executed once: one key got 201, the others 409 DUPLICATE_MERCHANT_REFERENCE naming that payment"},
		{CheckNoStuckRecords, checkNoStuck,
			"after the faults healed, no record stayed IN_PROGRESS or UNKNOWN_REQUIRES_RECOVERY, and every outbox, queue and email backlog drained, within the bound"},
		{CheckNoInternalErrors, checkNoInternal,
			"no call was answered 500 INTERNAL"},
		{CheckSweepReplays, checkSweep,
			"after the faults healed, every answered command resent once more got a replay of its answer"},
		{CheckSidecarSingleExecution, checkSidecarSingleExecution,
			"the upstream behind the sidecar route executed each derived key at most once, and exactly once for a command answered 2xx"},
		{CheckSidecarIdenticalAnswers, checkSidecarIdenticalAnswers,
			"every 2xx answer of one sidecar command is byte-identical, the sweep's resend replays it, and no retry was refused as a different request"},
		{CheckGRPCSingleExecution, checkGRPCSingleExecution,
			"each gRPC command's side effect happened at most once, exactly once for a command answered, and its answer names that execution"},
		{CheckGRPCAnswers, checkGRPCAnswers,
			"every gRPC command was answered (none lost), every answer of one command is the same, the sweep's resend is a replay of it (idempotent-replayed), and no call was refused as a reused key or failed INTERNAL"},
		{CheckDrillBounds, nil,
			"a failover-type scenario's drill figures met their bounds: RTO of the failed region's tenants at most the region lease TTL (plus --auto-failover-after) + 4s; no acknowledged answer lost, no duplicate charge, payment, ledger entry or email, no record stuck"},
		{CheckLinearizable, checkLinearizability,
			"per key, the history is linearizable against a register model (unbound → bound to one command → answered once; ambiguous calls may or may not take effect) — porcupine"},
	}
}

// Checks describes every check, in report order.
func Checks() []CheckInfo {
	var out []CheckInfo
	for _, c := range checkTable() {
		out = append(out, CheckInfo{c.name, c.description})
	}
	return out
}

// CheckResult is the verdict of one check.
type CheckResult struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Passed      bool   `json:"passed"`
	// Skipped checks had nothing to look at (they count as passed).
	Skipped bool `json:"skipped,omitempty"`
	// Warnings counts findings that do not fail the check: behaviour the
	// project documents as a trade-off (see the counter-examples marked
	// warning).
	Warnings int `json:"warnings,omitempty"`
	// Violations counts the findings that fail the check (the
	// counter-examples kept are at most maxCounterExamples of them).
	Violations      int              `json:"violations,omitempty"`
	Details         string           `json:"details"`
	CounterExamples []CounterExample `json:"counterExamples,omitempty"`
	// Visualization is porcupine's HTML, relative to the report.
	Visualization string `json:"visualization,omitempty"`
}

// CounterExample is one violation: the key or identity it concerns, what
// is wrong, and the calls and rows that show it.
type CounterExample struct {
	Key     string `json:"key,omitempty"`
	Summary string `json:"summary"`
	// Warning marks a documented deviation that does not fail the check.
	Warning bool  `json:"warning,omitempty"`
	Ops     []*Op `json:"ops,omitempty"`
	Rows    []any `json:"rows,omitempty"`
}

// maxCounterExamples bounds the counter-examples kept per check.
const maxCounterExamples = 10

// checkInput is everything the checks look at.
type checkInput struct {
	ops         []*Op
	st          *dbState
	homes       map[string]string
	charges     *provider.ChargeCounts // nil without a provider
	quiesced    bool
	quiesceTook time.Duration
	stuckBound  time.Duration
	reexecute   bool
	faults      []FaultEvent
	outDir      string
	linTimeout  time.Duration
	// sidecar is the sidecar route's traffic and upstream (nil: not a
	// sidecar scenario).
	sidecar *sidecarResult
	// grpc is the gRPC scenario's calls and effects (nil: not a gRPC
	// scenario).
	grpc *grpcResult
	// sweepHealth is why the cluster was not healthy before the replay
	// sweep ("" when it was).
	sweepHealth string
	// byKey is ops grouped by scoped key (set by runChecks).
	byKey map[string][]*Op
}

// result collects a check's counter-examples.
type result struct {
	CheckResult
	total int
}

func newResult(name string) *result {
	r := &result{}
	r.Name = name
	for _, d := range Checks() {
		if d.Name == name {
			r.Description = d.Description
		}
	}
	return r
}

func (r *result) fail(ce CounterExample) {
	r.total++
	if len(r.CounterExamples) < maxCounterExamples {
		r.CounterExamples = append(r.CounterExamples, ce)
	}
}

// warn records a finding that does not fail the check.
func (r *result) warn(ce CounterExample) {
	r.Warnings++
	ce.Warning = true
	if len(r.CounterExamples) < maxCounterExamples {
		r.CounterExamples = append(r.CounterExamples, ce)
	}
}

func (r *result) done(details string, args ...any) CheckResult {
	r.Passed = r.total == 0
	r.Violations = r.total
	r.Details = fmt.Sprintf(details, args...)
	if r.Warnings > 0 {
		r.Details = fmt.Sprintf("%d warning(s); ", r.Warnings) + r.Details
	}
	if r.total > 0 {
		r.Details = fmt.Sprintf("%d violation(s); ", r.total) + r.Details
	}
	return r.CheckResult
}

// runChecks runs every check.
func runChecks(in *checkInput) []CheckResult {
	in.byKey = groupByKey(in.ops)
	var out []CheckResult
	for _, c := range checkTable() {
		if c.run != nil {
			out = append(out, c.run(in))
		}
	}
	return out
}

// groupByKey groups ops by scoped key, keeping each group in start order.
func groupByKey(ops []*Op) map[string][]*Op {
	out := map[string][]*Op{}
	for _, o := range ops {
		out[o.partitionKey()] = append(out[o.partitionKey()], o)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func checkFaults(in *checkInput) CheckResult {
	r := newResult(CheckFaults)
	for _, f := range in.faults {
		var problems []string
		if f.Skipped != "" {
			problems = append(problems, "skipped: "+f.Skipped)
		}
		for _, p := range []struct{ what, err string }{
			{"health before", f.PreHealthError}, {"inject", f.InjectError}, {"heal", f.HealError}, {"health after", f.PostHealthError},
		} {
			if p.err != "" {
				problems = append(problems, p.what+": "+p.err)
			}
		}
		if len(problems) > 0 {
			r.fail(CounterExample{Key: f.Name, Summary: strings.Join(problems, "; ")})
		}
	}
	if len(in.faults) == 0 {
		r.Skipped = true
		return r.done("no faults in this scenario")
	}
	return r.done("%d fault(s) injected and healed", len(in.faults))
}

// paymentByID indexes the run's payments by id (any store).
func paymentsByID(st *dbState) map[string][]dbPayment {
	out := map[string][]dbPayment{}
	for _, p := range st.Payments {
		out[p.ID] = append(out[p.ID], p)
	}
	return out
}

func checkSingleCharge(in *checkInput) CheckResult {
	r := newResult(CheckSingleCharge)
	if in.charges == nil {
		r.Skipped = true
		return r.done("the run has no provider")
	}
	byProviderKey := map[string]dbPayment{}
	for _, p := range in.st.Payments {
		byProviderKey[p.ProviderKey] = p
	}
	byRef := map[string][]string{}
	orphans := 0
	for _, k := range sortedKeys(in.charges.ByKey) {
		n := in.charges.ByKey[k]
		if n > 1 {
			r.fail(CounterExample{Key: k, Summary: fmt.Sprintf("provider key charged %d times", n)})
		}
		p, ok := byProviderKey[k]
		if !ok {
			orphans++
			continue
		}
		ref := p.Tenant + "/" + p.Account + "/" + p.Reference
		if !slices.Contains(byRef[ref], k) {
			byRef[ref] = append(byRef[ref], k)
		}
	}
	for _, ref := range sortedKeys(byRef) {
		if keys := byRef[ref]; len(keys) > 1 {
			r.fail(CounterExample{Key: ref, Summary: fmt.Sprintf("merchant reference charged through %d provider keys: %s", len(keys), strings.Join(keys, ", "))})
		}
	}
	return r.done("%d charge(s) applied over %d provider key(s); %d charge(s) of keys without a payment row", in.charges.Total, len(in.charges.ByKey), orphans)
}

func checkSinglePayment(in *checkInput) CheckResult {
	r := newResult(CheckSinglePayment)
	byRef := map[string][]dbPayment{}
	for _, p := range in.st.Payments {
		ref := p.Tenant + "/" + p.Account + "/" + p.Reference
		byRef[ref] = append(byRef[ref], p)
	}
	for _, ref := range sortedKeys(byRef) {
		ids := map[string]bool{}
		var rows []any
		for _, p := range byRef[ref] {
			ids[p.ID] = true
			rows = append(rows, p)
		}
		if len(ids) > 1 {
			r.fail(CounterExample{Key: ref, Summary: fmt.Sprintf("%d different payments for one merchant reference", len(ids)), Rows: rows})
		}
	}
	return r.done("%d payment row(s), %d merchant reference(s)", len(in.st.Payments), len(byRef))
}

func checkSingleLedger(in *checkInput) CheckResult {
	r := newResult(CheckSingleLedgerEntry)
	total := map[[2]string]int{}
	stores := map[[2]string][]string{}
	n := 0
	for k, c := range in.st.Ledger {
		id := [2]string{k[1], k[2]}
		total[id] += c
		stores[id] = append(stores[id], fmt.Sprintf("%s×%d", k[0], c))
		n += c
	}
	ids := make([][2]string, 0, len(total))
	for id := range total {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) })
	for _, id := range ids {
		if total[id] <= 1 {
			continue
		}
		slices.Sort(stores[id])
		ce := CounterExample{Key: id[1], Summary: fmt.Sprintf("%d %s ledger entries (stores: %s)", total[id], id[0], strings.Join(stores[id], ", "))}
		r.fail(ce)
	}
	return r.done("%d ledger entr(ies) for %d (type, payment) pair(s)", n, len(total))
}

func checkSingleEmail(in *checkInput) CheckResult {
	r := newResult(CheckSingleEmail)
	notes := map[string]int{}
	where := map[string][]string{}
	for k, c := range in.st.Notifications {
		notes[k[1]] += c
		where[k[1]] = append(where[k[1]], fmt.Sprintf("%s×%d", k[0], c))
	}
	for _, id := range sortedKeys(notes) {
		if notes[id] <= 1 {
			continue
		}
		slices.Sort(where[id])
		ce := CounterExample{Key: id, Summary: fmt.Sprintf("%d receipt notifications (stores: %s)", notes[id], strings.Join(where[id], ", "))}
		r.fail(ce)
	}
	sent := 0
	for _, k := range sortedKeys(in.st.Sent) {
		sent += in.st.Sent[k]
		if in.st.Sent[k] > 1 {
			var w []string
			for sk, c := range in.st.SentByStore {
				if sk[1] == k {
					w = append(w, fmt.Sprintf("%s×%d", sk[0], c))
				}
			}
			slices.Sort(w)
			ce := CounterExample{Key: k, Summary: fmt.Sprintf("email sent %d times (stores: %s)", in.st.Sent[k], strings.Join(w, ", "))}
			r.fail(ce)
		}
	}
	return r.done("%d notification(s), %d email(s) sent", len(notes), sent)
}

func checkAckedNotLost(in *checkInput) CheckResult {
	r := newResult(CheckAckedNotLost)
	byKey := in.byKey
	pays := paymentsByID(in.st)
	acked := 0
	for _, k := range sortedKeys(byKey) {
		var ack *Op
		for _, o := range byKey[k] {
			if o.Status == 201 && o.PaymentID != "" {
				ack = o
				break
			}
		}
		if ack == nil {
			continue
		}
		acked++
		var problems []string
		if len(pays[ack.PaymentID]) == 0 {
			problems = append(problems, "no payment row "+ack.PaymentID+" in any store")
		}
		if in.charges != nil {
			if n := in.charges.ByKey[provider.ProviderKeyFor(ack.PaymentID)]; n != 1 {
				problems = append(problems, fmt.Sprintf("provider charged %s %d times", provider.ProviderKeyFor(ack.PaymentID), n))
			}
		}
		if len(problems) > 0 {
			r.fail(CounterExample{Key: k, Summary: strings.Join(problems, "; "), Ops: []*Op{ack}})
		}
	}
	return r.done("%d acknowledged payment(s)", acked)
}

func checkIdenticalAnswers(in *checkInput) CheckResult {
	r := newResult(CheckIdenticalAnswers)
	byKey := in.byKey
	checked := 0
	for _, k := range sortedKeys(byKey) {
		var first *Op
		var diff []*Op
		for _, o := range byKey[k] {
			if o.Class() != ClassFinal {
				continue
			}
			if first == nil {
				first = o
				continue
			}
			if o.RespHash != first.RespHash {
				diff = append(diff, o)
			}
		}
		if first != nil {
			checked++
		}
		if len(diff) > 0 {
			r.fail(CounterExample{Key: k, Summary: fmt.Sprintf("%d answer(s) differ from the first final answer", len(diff)), Ops: append([]*Op{first}, diff...)})
		}
	}
	return r.done("%d key(s) with a final answer", checked)
}

func checkReusedNotExecuted(in *checkInput) CheckResult {
	r := newResult(CheckReusedNotExecuted)
	n := 0
	for _, o := range in.ops {
		if !o.Reused {
			continue
		}
		n++
		if c := o.Class(); c == ClassFinal {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "the different command got a final answer instead of 409 key reused", Ops: []*Op{o}})
		}
		for _, p := range in.st.Payments {
			if p.Tenant == o.Tenant && p.Account == o.Command.AccountID && p.Reference == o.Command.MerchantReference && p.AmountMinor == o.Command.AmountMinor {
				r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "a payment with the different command's amount exists", Ops: []*Op{o}, Rows: []any{p}})
			}
		}
	}
	if n == 0 {
		r.Skipped = true
	}
	return r.done("%d call(s) reused a key with a different command", n)
}

func checkNoFalseKeyReuse(in *checkInput) CheckResult {
	r := newResult(CheckNoFalseKeyReuse)
	for _, o := range in.ops {
		if !o.Reused && o.Class() == ClassConflict {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "the same command (re-serialised) was refused as a different one", Ops: []*Op{o}})
		}
	}
	return r.done("%d call(s) checked", len(in.ops))
}

func checkDuplicateReference(in *checkInput) CheckResult {
	r := newResult(CheckDuplicateReference)
	type refOps struct {
		created map[string]*Op // key -> a 201
		dups    []*Op
	}
	byRef := map[string]*refOps{}
	for _, o := range in.ops {
		if o.Reused || o.Class() != ClassFinal {
			continue
		}
		ref := o.Tenant + "/" + o.Command.AccountID + "/" + o.Command.MerchantReference
		ro := byRef[ref]
		if ro == nil {
			ro = &refOps{created: map[string]*Op{}}
			byRef[ref] = ro
		}
		switch {
		case o.Status == 201:
			if _, ok := ro.created[o.Key]; !ok {
				ro.created[o.Key] = o
			}
		case o.ErrorCode == codeDuplicateRef:
			ro.dups = append(ro.dups, o)
		}
	}
	multi := 0
	for _, ref := range sortedKeys(byRef) {
		ro := byRef[ref]
		if len(ro.created)+len(ro.dups) > 1 {
			multi++
		}
		if len(ro.created) > 1 {
			var ops []*Op
			ids := map[string]bool{}
			for _, k := range sortedKeys(ro.created) {
				ops = append(ops, ro.created[k])
				ids[ro.created[k].PaymentID] = true
			}
			summary := fmt.Sprintf("%d keys created %d different payments for one merchant reference", len(ro.created), len(ids))
			if len(ids) > 1 {
				r.fail(CounterExample{Key: ref, Summary: summary, Ops: ops})
				continue
			}
			summary = fmt.Sprintf("%d keys were answered 201 for the same payment; all but the first should get 409 DUPLICATE_MERCHANT_REFERENCE", len(ro.created))
			if in.reexecute {
				// After a failover, the new home cannot see the old
				// region's payment before the handover; it finds the
				// charge at the provider, and the charge's reference
				// (payments.ChargeReference) tells it another key made
				// it, so it answers 409. Only a charge without a
				// reference (an older idemd) still gets here.
				r.warn(CounterExample{Key: ref, Summary: summary + " (after a failover, before the handover, for a charge that carries no reference)", Ops: ops})
				continue
			}
			r.fail(CounterExample{Key: ref, Summary: summary, Ops: ops})
			continue
		}
		for _, c := range ro.created {
			for _, d := range ro.dups {
				if d.PaymentID != "" && d.PaymentID != c.PaymentID {
					r.fail(CounterExample{Key: ref, Summary: "409 duplicate names another payment than the one created", Ops: []*Op{c, d}})
				}
			}
		}
	}
	return r.done("%d merchant reference(s) sent more than once", multi)
}

func checkNoStuck(in *checkInput) CheckResult {
	r := newResult(CheckNoStuckRecords)
	stuck := stuckRecords(in.st, in.homes)
	for _, s := range stuck {
		r.fail(CounterExample{Key: s.Tenant + "/" + s.Key, Summary: fmt.Sprintf("%s at %s in store %s, last updated %s", s.Status, s.Checkpoint, s.Store, s.UpdatedAt.Format(time.RFC3339)), Rows: []any{s}})
	}
	for _, name := range sortedKeys(in.st.Backlog) {
		b := in.st.Backlog[name]
		if b[0]+b[1]+b[2] > 0 {
			r.fail(CounterExample{Key: name, Summary: fmt.Sprintf("store %s: %d unpublished outbox event(s), %d unprocessed queue message(s), %d unsent email(s)", name, b[0], b[1], b[2])})
		}
	}
	leased := 0
	for _, n := range in.st.Leased {
		leased += n
	}
	note := ""
	if leased > 0 {
		note = fmt.Sprintf("; %d unsent email(s) still under a sender's claim (outbox.SendLease), not counted", leased)
	}
	if in.quiesced {
		return r.done("quiesced %v after the traffic stopped (bound %v)%s", in.quiesceTook.Round(100*time.Millisecond), in.stuckBound, note)
	}
	return r.done("not quiesced within %v%s", in.stuckBound, note)
}

func checkNoInternal(in *checkInput) CheckResult {
	r := newResult(CheckNoInternalErrors)
	for _, o := range in.ops {
		if o.Status == 500 {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "500 " + o.ErrorCode, Ops: []*Op{o}})
		}
	}
	return r.done("%d call(s) checked", len(in.ops))
}

func checkSweep(in *checkInput) CheckResult {
	r := newResult(CheckSweepReplays)
	if in.sweepHealth != "" {
		r.fail(CounterExample{Summary: "the cluster did not become healthy before the sweep: " + in.sweepHealth})
	}
	n := 0
	for _, o := range in.ops {
		if !o.Sweep {
			continue
		}
		n++
		if o.Class() != ClassFinal || !o.Replayed {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "answered " + o.Outcome() + ", not a replay", Ops: []*Op{o}})
		}
	}
	if n == 0 {
		r.Skipped = true
	}
	return r.done("%d answered command(s) resent after the faults", n)
}

func checkLinearizability(in *checkInput) CheckResult {
	r := newResult(CheckLinearizable)
	viz := ""
	if in.outDir != "" {
		viz = filepath.Join(in.outDir, "linearizability.html")
	}
	res, err := checkLinearizable(in.ops, in.reexecute, in.linTimeout, viz)
	if err != nil {
		r.fail(CounterExample{Summary: err.Error()})
	}
	for _, k := range res.Illegal {
		ops := in.byKey[k]
		if len(ops) > 12 {
			ops = ops[:12]
		}
		r.fail(CounterExample{Key: k, Summary: "no linearization of this key's calls exists", Ops: ops})
	}
	if res.Visualization != "" {
		r.Visualization = filepath.Base(res.Visualization)
	}
	mode := "strict: a key is executed once"
	if in.reexecute {
		mode = "after a failover: the new home may execute a key again with the same answer"
	}
	switch res.Result {
	case porcupine.Unknown:
		return r.done("porcupine timed out after %v (result unknown, counted as passed); %d keys; %s", in.linTimeout, len(in.byKey), mode)
	case porcupine.Illegal:
		return r.done("%d of %d keys not linearizable; %s", len(res.Illegal), len(in.byKey), mode)
	}
	return r.done("%d keys, %d calls: linearizable; %s", len(in.byKey), len(in.ops), mode)
}

// paymentAnswer is a 201 body in schema v2 or v3.
type paymentAnswer struct {
	PaymentID         string  `json:"paymentId"` // v2
	ID                string  `json:"id"`        // v3
	CreatedAt         *string `json:"createdAt"` // v3
	AccountID         string  `json:"accountId"`
	Amount            string  `json:"amount"`
	Currency          string  `json:"currency"`
	MerchantReference string  `json:"merchantReference"`
	Channel           string  `json:"channel"`
}

func checkAnswerMatches(in *checkInput) CheckResult {
	r := newResult(CheckAnswerMatches)
	pays := paymentsByID(in.st)
	seen := map[string]bool{}
	n := 0
	for _, o := range in.ops {
		if o.Status != 201 || seen[o.RespHash] {
			continue
		}
		seen[o.RespHash] = true
		var a paymentAnswer
		if err := json.Unmarshal([]byte(o.RespBody), &a); err != nil {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: "201 body is not a payment: " + err.Error(), Ops: []*Op{o}})
			continue
		}
		id := firstNonEmpty(a.PaymentID, a.ID)
		rows := pays[id]
		if len(rows) == 0 {
			continue // acknowledged-not-lost reports it
		}
		n++
		p := rows[0]
		var diffs []string
		for _, f := range []struct{ name, got, want string }{
			{"accountId", a.AccountID, p.Account},
			{"amount", a.Amount, formatMinor(p.AmountMinor, 2)},
			{"currency", a.Currency, p.Currency},
			{"merchantReference", a.MerchantReference, p.Reference},
			{"channel", a.Channel, p.Channel},
		} {
			if f.got != f.want {
				diffs = append(diffs, fmt.Sprintf("%s %q, stored %q", f.name, f.got, f.want))
			}
		}
		if a.CreatedAt != nil {
			if want := p.CreatedAt.UTC().Format(time.RFC3339); *a.CreatedAt != want {
				diffs = append(diffs, fmt.Sprintf("createdAt %s, payment created at %s", *a.CreatedAt, p.CreatedAt.UTC().Format(time.RFC3339Nano)))
			}
		}
		if len(diffs) > 0 {
			r.fail(CounterExample{Key: o.Tenant + "/" + o.Key, Summary: strings.Join(diffs, "; "), Ops: []*Op{o}, Rows: []any{p}})
		}
	}
	return r.done("%d distinct 201 answer(s) compared with their payment", n)
}

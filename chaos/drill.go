package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Failover modes of a drill (Drill.Failover).
const (
	// FailoverManual: the failover is performed by the harness (or the
	// operator's drill) once the region's leases have lapsed, as
	// "idemctl region failover" does.
	FailoverManual = "manual"
	// FailoverAuto: the nodes fail over by themselves (idemd
	// --auto-failover-after); nobody acts.
	FailoverAuto = "auto"
	// FailoverNone: the region comes back without a failover.
	FailoverNone = "none"
)

// RTOSlack is what the RTO bound allows beyond the nodes' region lease TTL:
// the failover's own wait (--auto-failover-after, or the operator's
// command), the placement watch and a client's next call. Since the RTO
// runs to the first answer after the tenant's last unserved call (the
// outage, not the first answer after the fault), the docker environment's
// region-failover measured 3.1 to 3.8 s with a 3 s lease when etcd elected
// no leader meanwhile (5.3 to 6.0 s when it did, under
// EtcdElectionSlack's bound) in 18 runs where no node's watch opened
// again on a cut-off etcd member; the runs where one did measured 6.8 and
// 7.1 s, which routing.Map's steering (routing/steer.go) now prevents: 4 s
// covers it.
const RTOSlack = 4 * time.Second

// EtcdElectionSlack is what the RTO bound allows more when etcd elected a
// leader between the cut and the move (the failed region held the leader,
// as it can in the docker environment, which puts a member in each region;
// or a member missed heartbeats under load): the members notice the
// leader's loss (up to twice its election timeout of 1s), the new leader
// extends every lease by one election timeout before any can expire, and
// checks for expired leases every 500ms.
const EtcdElectionSlack = 4 * time.Second

// Drill holds the figures of a failover-type scenario, the ones an SRE
// reports after a failover drill: how long the failed region's tenants
// went unserved (RTO), and what the failover lost, duplicated or left stuck
// (RPO and integrity), each against its bound.
type Drill struct {
	// Fault is the drill's fault; Region the region it took down.
	Fault  string `json:"fault"`
	Region string `json:"region"`
	// Failover is FailoverManual, FailoverAuto or FailoverNone.
	Failover string `json:"failover"`
	// FaultAt is when the fault was injected, in seconds from the start of
	// the traffic.
	FaultAt float64 `json:"faultAt"`
	// Tenants are the affected tenants (homed in Region when the fault
	// began) and their RTO each: the time from the fault to the moment
	// after which the tenant is served again continuously (see
	// TenantRTO).
	Tenants []TenantRTO `json:"tenants"`
	// RTOMaxSeconds is the largest tenant RTO (-1 when a tenant was never
	// served again); RTOBoundSeconds its bound: the region lease TTL plus
	// RTOSlack.
	RTOMaxSeconds   float64 `json:"rtoMaxSeconds"`
	RTOBoundSeconds float64 `json:"rtoBoundSeconds"`
	// EtcdElection is set when etcd elected a leader between the cut and
	// the move (its raft term grew): the bound then includes
	// EtcdElectionSlack.
	EtcdElection bool `json:"etcdElection,omitempty"`
	// AckedLost is the RPO: acknowledged answers (201) whose payment no
	// store holds, or that the provider did not charge exactly once.
	AckedLost int `json:"ackedLost"`
	// Duplicate effects, over every store and the provider.
	DuplicateCharges       int `json:"duplicateCharges"`
	DuplicatePayments      int `json:"duplicatePayments"`
	DuplicateLedgerEntries int `json:"duplicateLedgerEntries"`
	DuplicateEmails        int `json:"duplicateEmails"`
	// RecordsStuck counts records still open, and backlogs not drained,
	// once the traffic stopped and the stuck bound passed.
	RecordsStuck int `json:"recordsStuck"`
	// Redirected counts the calls sent after the fault to a node of Region
	// that refused the connection and went on to a live node, as a client
	// with several endpoints does (the workload records them with
	// RedirectedFrom).
	Redirected int `json:"redirected"`
	// StoreLost is set when the region's store did not answer after the
	// fault: in region-local mode what it alone held is lost, and AckedLost
	// counts it (the RPO of region-local mode); nothing is waited for.
	StoreLost bool `json:"storeLost,omitempty"`
	// AnswersLost and EffectsLost, with StoreLost: acknowledged answers
	// the sweep got again but not as a replay (their records were in the
	// lost store alone), and acknowledged payments whose confirmed ledger
	// entry no surviving store holds.
	AnswersLost int `json:"answersLost,omitempty"`
	EffectsLost int `json:"effectsLost,omitempty"`
	// Figures lists every figure with its bound and whether it met it.
	Figures []DrillFigure `json:"figures"`
	// Passed is true when every figure met its bound.
	Passed bool `json:"passed"`
}

// TenantRTO is one affected tenant's recovery time.
type TenantRTO struct {
	Tenant string `json:"tenant"`
	// Seconds is the RTO: from the fault to the end of the first call
	// that got a final answer among those sent after the tenant's last
	// unserved call (no answer, or a 5xx, from a region other than the
	// failed one) sent after the fault; -1 when none did.
	Seconds float64 `json:"seconds"`
	// LastUnservedAt is when the tenant's last unserved call after the
	// fault was sent, in seconds from the start of the traffic (0 when
	// every call after the fault was served).
	LastUnservedAt float64 `json:"lastUnservedAt,omitempty"`
	// Node is the node that gave the first final answer.
	Node string `json:"node,omitempty"`
}

// DrillFigure is one drill figure against its bound.
type DrillFigure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Bound float64 `json:"bound"`
	Unit  string  `json:"unit,omitempty"`
	Met   bool    `json:"met"`
}

// DrillFault is implemented by faults that take a region down and whose
// scenario therefore reports drill figures.
type DrillFault interface {
	Fault
	// DrillRegion is the region the fault takes down.
	DrillRegion() string
	// FailoverMode is FailoverManual, FailoverAuto or FailoverNone.
	FailoverMode() string
}

// drillInput is what a drill's figures are computed from.
type drillInput struct {
	fault    string
	region   string
	failover string
	at       float64 // seconds from the start of the traffic
	// homes are the tenants' home regions when the fault began.
	homes map[string]string
	ops   []*Op
	// checks are the scenario's check results (violations are counted
	// from them).
	checks []CheckResult
	// bound is the RTO bound.
	bound time.Duration
}

// unserved reports whether a call got no service: no answer at all (a
// timeout, a refused or broken connection) or a 5xx (the home region
// unavailable, the store unavailable).
func unserved(o *Op) bool { return o.Status == 0 || o.Status >= 500 }

// tenantRTO measures how long tenant went unserved after the fault at at,
// which took region down: until the end of the first call that got a
// final answer among those sent after the tenant's last unserved call
// (every call sent after that one was served, or answered otherwise than
// by an outage). A call that happened to be answered between the fault's
// start and its effect (a kill command that had not killed yet) ends
// nothing. Calls that the failed region's own nodes answered without
// service (cut off, they refuse with 503) are not counted as unserved: a
// client that meets them goes on to another region, and the outage is how
// long the rest of the cluster made the tenant wait. Without an unserved
// call after the fault, it is the first final answer to a call sent after
// it.
func tenantRTO(tenant, region string, at time.Duration, ops []*Op) TenantRTO {
	rto := TenantRTO{Tenant: tenant, Seconds: -1}
	from, failed := at, false
	for _, o := range ops {
		if o.Tenant == tenant && !o.Sweep && o.Start >= at && unserved(o) && o.Region != region && (!failed || o.Start > from) {
			from, failed = o.Start, true
		}
	}
	var first *Op
	for _, o := range ops {
		if o.Tenant != tenant || o.Sweep || o.Start < from || (failed && o.Start == from) || o.Class() != ClassFinal {
			continue
		}
		if first == nil || o.End < first.End {
			first = o
		}
	}
	if first != nil {
		rto.Seconds = (first.End - at).Seconds()
		rto.Node = first.Node
	}
	if failed {
		rto.LastUnservedAt = from.Seconds()
	}
	return rto
}

// computeDrill measures the drill figures.
func computeDrill(in drillInput) *Drill {
	d := &Drill{Fault: in.fault, Region: in.region, Failover: in.failover, FaultAt: in.at,
		RTOBoundSeconds: in.bound.Seconds(), Tenants: []TenantRTO{}}
	var tenants []string
	for t, r := range in.homes {
		if r == in.region {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	at := time.Duration(in.at * float64(time.Second))
	for _, t := range tenants {
		d.Tenants = append(d.Tenants, tenantRTO(t, in.region, at, in.ops))
	}
	for _, o := range in.ops {
		if o.Start >= at && strings.HasPrefix(o.RedirectedFrom, in.region+"-") {
			d.Redirected++
		}
	}
	for _, t := range d.Tenants {
		if t.Seconds < 0 {
			d.RTOMaxSeconds = -1
			break
		}
		d.RTOMaxSeconds = max(d.RTOMaxSeconds, t.Seconds)
	}
	violations := func(name string) int {
		for _, c := range in.checks {
			if c.Name == name {
				return c.Violations
			}
		}
		return 0
	}
	d.AckedLost = violations(CheckAckedNotLost)
	d.DuplicateCharges = violations(CheckSingleCharge)
	d.DuplicatePayments = violations(CheckSinglePayment)
	d.DuplicateLedgerEntries = violations(CheckSingleLedgerEntry)
	d.DuplicateEmails = violations(CheckSingleEmail)
	d.RecordsStuck = violations(CheckNoStuckRecords)
	rtoMet := len(d.Tenants) > 0 && d.RTOMaxSeconds >= 0 && d.RTOMaxSeconds <= d.RTOBoundSeconds
	d.Figures = []DrillFigure{
		{Name: "RTO (max over the affected tenants)", Value: d.RTOMaxSeconds, Bound: d.RTOBoundSeconds, Unit: "s", Met: rtoMet},
		{Name: "acknowledged answers lost (RPO)", Value: float64(d.AckedLost)},
		{Name: "duplicate charges", Value: float64(d.DuplicateCharges)},
		{Name: "duplicate payments", Value: float64(d.DuplicatePayments)},
		{Name: "duplicate ledger entries", Value: float64(d.DuplicateLedgerEntries)},
		{Name: "duplicate emails", Value: float64(d.DuplicateEmails)},
		{Name: "records stuck", Value: float64(d.RecordsStuck)},
	}
	d.Passed = true
	for i := range d.Figures {
		if i > 0 {
			d.Figures[i].Met = d.Figures[i].Value == 0
		}
		d.Passed = d.Passed && d.Figures[i].Met
	}
	return d
}

// drillCheck turns drills' figures into a check, so that a figure past
// its bound fails the scenario like any other finding.
func drillCheck(drills ...*Drill) CheckResult {
	r := newResult(CheckDrillBounds)
	var details []string
	for _, d := range drills {
		for _, f := range d.Figures {
			if !f.Met {
				r.fail(CounterExample{Key: d.Region, Summary: fmt.Sprintf("%s: %s is %g%s, bound %g%s", d.Fault, f.Name, f.Value, f.Unit, f.Bound, f.Unit)})
			}
		}
		for _, t := range d.Tenants {
			if t.Seconds < 0 {
				r.fail(CounterExample{Key: t.Tenant, Summary: d.Fault + ": never answered finally after the fault"})
			}
		}
		details = append(details, fmt.Sprintf("%s: RTO max %.2fs (bound %.1fs) over %d tenant(s), %s failover, %d call(s) redirected to a live region",
			d.Fault, d.RTOMaxSeconds, d.RTOBoundSeconds, len(d.Tenants), d.Failover, d.Redirected))
	}
	return r.done("%s", strings.Join(details, "; "))
}

// DrillRegion implements DrillFault.
func (f *regionFailover) DrillRegion() string { return f.from }

// FailoverMode implements DrillFault.
func (f *regionFailover) FailoverMode() string { return FailoverManual }

// scenarioDrills computes the drill figures of every DrillFault among steps
// that ran (none when there is none), and the drill-bounds check over all
// of them, which is skipped without a drill.
func scenarioDrills(steps []Step, events []FaultEvent, homes map[string]string, ops []*Op, checks []CheckResult, leaseTTL time.Duration) ([]*Drill, CheckResult) {
	var drills []*Drill
	for i, st := range steps {
		df, ok := st.Fault.(DrillFault)
		if !ok || i >= len(events) || events[i].Skipped != "" {
			continue
		}
		bound := leaseTTL + RTOSlack
		if rb, ok := st.Fault.(interface {
			RTOBound(leaseTTL time.Duration) time.Duration
		}); ok {
			bound = rb.RTOBound(leaseTTL)
		}
		ef, elected := st.Fault.(interface{ EtcdElected() bool })
		elected = elected && ef.EtcdElected()
		if elected {
			bound += EtcdElectionSlack
		}
		at := max(events[i].At, events[i].CutAt)
		d := computeDrill(drillInput{fault: df.Name(), region: df.DrillRegion(), failover: df.FailoverMode(), at: at,
			homes: homes, ops: ops, checks: checks, bound: bound})
		d.EtcdElection = elected
		if sl, ok := st.Fault.(interface{ StoreLost() bool }); ok && sl.StoreLost() {
			d.StoreLost = true
			d.Figures[1].Name = "acknowledged answers lost (RPO: the region's store is gone)"
		}
		drills = append(drills, d)
	}
	if len(drills) == 0 {
		r := newResult(CheckDrillBounds)
		r.Skipped = true
		return nil, r.done("no failover in this scenario")
	}
	return drills, drillCheck(drills...)
}

// withCheck inserts c into checks at its place in Checks' order.
func withCheck(checks []CheckResult, c CheckResult) []CheckResult {
	order := map[string]int{}
	for i, ci := range Checks() {
		order[ci.Name] = i
	}
	i := slices.IndexFunc(checks, func(x CheckResult) bool { return order[x.Name] > order[c.Name] })
	if i < 0 {
		return append(checks, c)
	}
	return slices.Insert(checks, i, c)
}

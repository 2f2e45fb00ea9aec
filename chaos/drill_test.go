package chaos

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestComputeDrill: the RTO of each tenant homed in the failed region is
// the end of its first final answer sent after its last unserved call
// (after the fault; or after the fault when none was unserved); tenants of other
// regions are left out; a tenant never answered again fails the bound; the
// integrity figures come from the checks' violations.
func TestComputeDrill(t *testing.T) {
	s := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	ops := []*Op{
		{Tenant: "tenant-a", Start: s(9), End: s(9.5), Status: 201, Node: "eu-west-0"},         // before the fault
		{Tenant: "tenant-a", Start: s(10.5), End: s(11), Status: 503, Node: "us-east-0"},       // not final
		{Tenant: "tenant-a", Start: s(12), End: s(14.5), Status: 201, Node: "us-east-1"},       // first final: 4.5s
		{Tenant: "tenant-a", Start: s(13), End: s(14), Status: 409, ErrorCode: codeInProgress}, // not final
		{Tenant: "tenant-a", Start: s(15), End: s(15.1), Status: 201, Node: "us-east-0"},
		{Tenant: "tenant-c", Start: s(10.2), End: s(13), Status: 402, Node: "us-east-0"},   // 3s
		{Tenant: "tenant-b", Start: s(10.1), End: s(10.2), Status: 201, Node: "us-east-0"}, // other region
	}
	homes := map[string]string{"tenant-a": "eu-west", "tenant-b": "us-east", "tenant-c": "eu-west"}
	checks := []CheckResult{{Name: CheckSingleEmail, Violations: 2}, {Name: CheckAckedNotLost}}
	d := computeDrill(drillInput{fault: "f", region: "eu-west", failover: FailoverAuto, at: 10, homes: homes, ops: ops, checks: checks, bound: 6 * time.Second})
	if len(d.Tenants) != 2 || d.Tenants[0].Tenant != "tenant-a" || d.Tenants[0].Seconds != 4.5 || d.Tenants[0].Node != "us-east-1" ||
		d.Tenants[1].Tenant != "tenant-c" || d.Tenants[1].Seconds != 3 {
		t.Fatalf("tenants = %+v, want tenant-a 4.5s (us-east-1) and tenant-c 3s", d.Tenants)
	}
	if d.RTOMaxSeconds != 4.5 || !d.Figures[0].Met {
		t.Errorf("RTO max %v met %v, want 4.5 within 6", d.RTOMaxSeconds, d.Figures[0].Met)
	}
	if d.DuplicateEmails != 2 || d.Passed {
		t.Errorf("duplicate emails %d, passed %v; want 2 and a failed drill", d.DuplicateEmails, d.Passed)
	}
	if c := drillCheck(d, clean0(homes, ops)); c.Passed || c.Violations != 1 {
		t.Errorf("drill check passed %v with %d violations, want 1 (the emails)", c.Passed, c.Violations)
	}

	tight := computeDrill(drillInput{region: "eu-west", at: 10, homes: homes, ops: ops, bound: 4 * time.Second})
	if tight.Figures[0].Met || tight.Passed {
		t.Error("an RTO of 4.5s met a 4s bound")
	}
	never := computeDrill(drillInput{region: "eu-west", at: 20, homes: homes, ops: ops, bound: time.Minute})
	if never.RTOMaxSeconds != -1 || never.Passed {
		t.Errorf("no answer after the fault: RTO max %v passed %v, want -1 and a failure", never.RTOMaxSeconds, never.Passed)
	}
	clean := computeDrill(drillInput{region: "eu-west", at: 10, homes: homes, ops: ops, bound: 6 * time.Second})
	if !clean.Passed {
		t.Errorf("clean drill failed: %+v", clean.Figures)
	}

	// The report shows the figures at the top of the page.
	rep := &Report{Scenarios: []ScenarioReport{{Name: "region-auto-failover", Drill: d, Drills: []*Drill{d}}}}
	var buf bytes.Buffer
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	top := strings.Index(page, "Failover drill")
	if top < 0 || top > strings.Index(page, `<h2 id="region-auto-failover"`) || !strings.Contains(page, "4.50s") {
		t.Error("report.html has no drill figures above the scenario's section")
	}
}

// clean0 is a drill that meets every bound.
func clean0(homes map[string]string, ops []*Op) *Drill {
	return computeDrill(drillInput{region: "eu-west", at: 10, homes: homes, ops: ops, bound: time.Minute})
}

// electedFault is a drill fault that reports whether etcd elected a leader.
type electedFault struct {
	Fault
	elected bool
}

func (f electedFault) DrillRegion() string  { return "eu-west" }
func (f electedFault) FailoverMode() string { return FailoverManual }
func (f electedFault) EtcdElected() bool    { return f.elected }

// TestDrillBoundAllowsForAnElection: the RTO bound is the lease TTL plus
// RTOSlack, and EtcdElectionSlack more only when etcd elected a leader
// between the cut and the move; it is measured from the cut.
func TestDrillBoundAllowsForAnElection(t *testing.T) {
	s := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	// Served again 8s after the cut: over 3s + RTOSlack, within the
	// election's allowance.
	ops := []*Op{{Tenant: "tenant-a", Start: s(17), End: s(18), Status: 201, Node: "us-east-0"}}
	homes := map[string]string{"tenant-a": "eu-west"}
	events := []FaultEvent{{At: 9, CutAt: 10}}
	for _, elected := range []bool{false, true} {
		steps := []Step{{Fault: electedFault{Fault: PartitionRegion("eu-west"), elected: elected}}}
		drills, check := scenarioDrills(steps, events, homes, ops, nil, 3*time.Second)
		if len(drills) != 1 {
			t.Fatalf("elected=%v: %d drills, want 1", elected, len(drills))
		}
		d := drills[0]
		want := (3*time.Second + RTOSlack).Seconds()
		if elected {
			want += EtcdElectionSlack.Seconds()
		}
		if d.RTOBoundSeconds != want || d.EtcdElection != elected || d.RTOMaxSeconds != 8 {
			t.Errorf("elected=%v: bound %vs, election %v, RTO %vs; want %vs, %v, 8s", elected, d.RTOBoundSeconds, d.EtcdElection, d.RTOMaxSeconds, want, elected)
		}
		if check.Passed != elected {
			t.Errorf("elected=%v: drill-bounds passed %v", elected, check.Passed)
		}
	}
}

// TestRTOMeasuresTheOutage: a call answered between the fault's start and
// its effect (a kill command that has not killed yet) is not the
// recovery: the RTO runs to the first final answer after the tenant's
// last unserved call (no answer, or a 5xx, from a region other than the
// failed one: a client meeting the failed region goes elsewhere), so it
// covers the outage the calls saw. Calls redirected from the region's
// refusing nodes are counted.
func TestRTOMeasuresTheOutage(t *testing.T) {
	s := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	ops := []*Op{
		{Tenant: "tenant-a", Start: s(10), End: s(10.01), Status: 201, Node: "eu-west-0"},                               // before the kill took
		{Tenant: "tenant-a", Start: s(10.2), End: s(12.2), Err: errTimeout},                                             // unserved
		{Tenant: "tenant-a", Start: s(11), End: s(11.1), Status: 503, RedirectedFrom: "eu-west-1"},                      // unserved
		{Tenant: "tenant-a", Start: s(13), End: s(13.2), Status: 409, ErrorCode: codeInProgress},                        // neither
		{Tenant: "tenant-a", Start: s(14.9), End: s(15.3), Status: 201, Node: "us-east-0"},                              // sent before the last failure
		{Tenant: "tenant-a", Start: s(15), End: s(15.5), Status: 503, Region: "us-east"},                                // the last unserved call
		{Tenant: "tenant-a", Start: s(16), End: s(16.1), Status: 503, Region: "eu-west", Node: "eu-west-1"},             // the failed region itself
		{Tenant: "tenant-a", Start: s(15.2), End: s(15.6), Status: 201, Node: "us-east-1", RedirectedFrom: "eu-west-0"}, // served again: 5.6s
		{Tenant: "tenant-b", Start: s(16), End: s(16.1), Status: 201, Node: "us-east-1", RedirectedFrom: "eu-west-0"},
		{Tenant: "tenant-b", Start: s(16), End: s(16.1), Status: 201, Node: "ap-south-1", RedirectedFrom: "us-east-0"},
	}
	homes := map[string]string{"tenant-a": "eu-west", "tenant-b": "us-east"}
	d := computeDrill(drillInput{region: "eu-west", at: 10, homes: homes, ops: ops, bound: 8 * time.Second})
	if len(d.Tenants) != 1 || d.Tenants[0].Seconds != 5.6 || d.Tenants[0].Node != "us-east-1" || d.Tenants[0].LastUnservedAt != 15 {
		t.Errorf("tenants = %+v; want tenant-a served again 5.6s after the fault by us-east-1, last unserved at 15s", d.Tenants)
	}
	if d.Redirected != 3 {
		t.Errorf("redirected = %d; want 3 (the calls eu-west's nodes refused after the fault)", d.Redirected)
	}
}

// boundFault is a drill fault with an RTO bound of its own.
type boundFault struct{ Fault }

func (boundFault) DrillRegion() string                           { return "eu-west" }
func (boundFault) FailoverMode() string                          { return FailoverNone }
func (boundFault) RTOBound(leaseTTL time.Duration) time.Duration { return leaseTTL + time.Minute }

// TestDrillBoundOfTheFault: a fault that says what its tenants wait for
// (the replicated store's failover) sets the RTO bound.
func TestDrillBoundOfTheFault(t *testing.T) {
	ops := []*Op{{Tenant: "tenant-a", Start: 11 * time.Second, End: 30 * time.Second, Status: 201}}
	drills, check := scenarioDrills([]Step{{Fault: boundFault{PartitionRegion("eu-west")}}}, []FaultEvent{{At: 10}},
		map[string]string{"tenant-a": "eu-west"}, ops, nil, 3*time.Second)
	if len(drills) != 1 || drills[0].RTOBoundSeconds != 63 || !check.Passed {
		t.Errorf("drills %+v, check passed %v; want one drill bounded by 63s that passed", drills, check.Passed)
	}
}

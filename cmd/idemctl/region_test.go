package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/pgserver"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// TestRegionFailoverFailbackHandover: with a default region list, a
// failover is one write that moves placed and unplaced tenants alike; the
// handover finds the unplaced tenants' records in the old store and ends
// their uncertainty with one mark; fail-back returns them.
func TestRegionFailoverFailbackHandover(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ep := []string{"--etcd-endpoints", strings.Join(etcd.Endpoints, ",")}
	run := func(args ...string) string {
		t.Helper()
		code, out := idemctlRun(t, nil, append(args, ep...)...)
		if code != 0 {
			t.Fatalf("idemctl %v: exit %d\n%s", args, code, out)
		}
		return out
	}
	if out := run("placement", "defaults", "--regions", "us-east,eu-west"); !strings.Contains(out, `"eu-west"`) {
		t.Fatalf("defaults = %s", out)
	}
	if code, out := idemctlRun(t, nil, append([]string{"placement", "defaults", "--regions", "eu-west"}, ep...)...); code == 0 {
		t.Errorf("changing the default regions succeeded: %s", out)
	}
	// An unplaced tenant homed in eu-west by the default rule.
	var fresh string
	for i := 0; fresh == ""; i++ {
		if tn := "fresh-" + string(rune('a'+i)); routing.DefaultHome(tn, []string{"eu-west", "us-east"}) == "eu-west" {
			fresh = tn
		}
	}
	run("placement", "set", "--tenant", "placed", "--region", "eu-west")

	oldStore, oldURL := regionStore(t, "idem_old_region")
	newStore, newURL := regionStore(t, "idem_new_region")
	d, err := oldStore.Begin(ctx, idem.BeginRequest{Scope: idem.Scope{Tenant: fresh, Operation: "op", Key: "k1"},
		RequestHashes: []string{"v1:a"}, HashVersion: 1, Owner: "test", LockFor: time.Minute, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := oldStore.Complete(ctx, d.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(`{}`), SchemaVersion: "v2"}}); err != nil {
		t.Fatal(err)
	}

	before := headRevision(t, etcd)
	var mv routing.RegionMove
	if err := json.Unmarshal([]byte(jsonPart(run("region", "failover", "--from", "eu-west", "--to", "us-east", "--wait", "1s"))), &mv); err != nil {
		t.Fatal(err)
	}
	if mv.ServedBy != "us-east" || mv.Epoch != before+1 || headRevision(t, etcd) != before+1 {
		t.Fatalf("failover = %+v (revision %d before); want one write", mv, before)
	}
	for _, tenant := range []string{fresh, "placed"} {
		if p, _, err := routing.GetPlacement(ctx, cli, tenant); err != nil || p.Region != "us-east" {
			t.Errorf("%s after the failover = %+v, %v", tenant, p, err)
		}
	}
	if out := run("region", "status"); !strings.Contains(out, `"servedBy": "us-east"`) {
		t.Errorf("status does not show the move:\n%s", out)
	}

	out := run("region", "handover", "--from", "eu-west", "--to", "us-east", "--from-database-url", oldURL, "--to-database-url", newURL)
	if !strings.Contains(out, fresh) {
		t.Errorf("handover did not cover the unplaced tenant %s:\n%s", fresh, out)
	}
	if rec, err := newStore.Get(ctx, idem.Scope{Tenant: fresh, Operation: "op", Key: "k1"}); err != nil || rec.Status != idem.StatusCompleted {
		t.Errorf("new store's record = %+v, %v", rec, err)
	}
	m, err := routing.NewMap(ctx, cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tenant := range []string{fresh, "placed"} {
		if f, ok := m.Failover(tenant); !ok || !f.HandedOver {
			t.Errorf("%s's failover = %+v %v; want handed over", tenant, f, ok)
		}
	}

	var back routing.RegionMove
	if err := json.Unmarshal([]byte(jsonPart(run("region", "failback", "--region", "eu-west"))), &back); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := routing.GetPlacement(ctx, cli, fresh); back.From != "us-east" || p.Region != "eu-west" || p.Epoch != back.Epoch {
		t.Errorf("fail-back = %+v; %s = %+v", back, fresh, p)
	}
}

// jsonPart drops the lines idemctl writes to stderr before its JSON.
func jsonPart(out string) string {
	if i := strings.Index(out, "{"); i >= 0 {
		return out[i:]
	}
	return out
}

func headRevision(t *testing.T, etcd *etcdtest.Server) int64 {
	t.Helper()
	resp, err := etcd.Client(t).Get(context.Background(), "/idem/never-written")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// regionStore starts a throwaway PostgreSQL for one region's store, stopped
// when the test ends (this package's other tests count child processes, so
// no server is shared across them).
func regionStore(t *testing.T, name string) (*store.Store, string) {
	t.Helper()
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	url, err := srv.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := payments.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	return st, url
}

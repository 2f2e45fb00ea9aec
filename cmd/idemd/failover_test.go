package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/providertest"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/routing"
)

func TestFailoverWithPartitionedRegion(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	prov := providertest.Start(t)
	if _, err := routing.SetPlacement(ctx, cli, "tenant-a", "eu-west"); err != nil {
		t.Fatal(err)
	}
	link := etcd.Link(t) // eu-west reaches etcd through a link of its own
	eu := startRegion(t, "eu-west", 1, link.Endpoint, nil, "--provider-url", prov.BaseURL)
	us := startRegion(t, "us-east", 1, strings.Join(etcd.Endpoints, ","), nil, "--provider-url", prov.BaseURL)
	a, b := eu.nodes[0].url, us.nodes[0].url

	status, first, _ := payBody(t, a, "before-partition", article)
	if status != 201 {
		t.Fatalf("payment before the partition = %d %s", status, first)
	}

	link.Cut() // partition eu-west from etcd; it keeps running
	partitioned := time.Now()
	waitFor(t, 20*time.Second, "eu-west to stop serving its tenant", func() bool {
		status, body, _ := payBody(t, a, "probe-"+time.Now().Format("150405.000000"), strings.Replace(article, "invoice-7781", "probe-"+time.Now().Format("150405.000000"), 1))
		return status == 503 && codeOf(body) == idem.ECodeNotHome
	})
	t.Logf("eu-west stopped serving %v after the partition", time.Since(partitioned).Round(10*time.Millisecond))

	var moved routing.RegionMove
	waitFor(t, 30*time.Second, "eu-west's lease to expire in etcd and the failover to run", func() bool {
		var err error
		moved, err = routing.MoveRegion(ctx, cli, "eu-west", "us-east", time.Now())
		if err != nil && !errors.Is(err, routing.ErrRegionAlive) {
			t.Fatal(err)
		}
		return err == nil
	})
	if p, _, err := routing.GetPlacement(ctx, cli, "tenant-a"); err != nil || p.Region != "us-east" || p.Epoch != moved.Epoch {
		t.Fatalf("tenant-a after the failover = %+v, %v; moved %+v", p, err, moved)
	}

	// The retry lands in us-east, which never saw the key: it asks the
	// provider and answers what eu-west answered.
	var again []byte
	waitFor(t, 20*time.Second, "us-east to serve the moved tenant", func() bool {
		var status int
		status, again, _ = payBody(t, b, "before-partition", article)
		if status != 201 && status != 503 {
			t.Fatalf("retry after failover = %d %s", status, again)
		}
		return status == 201
	})
	if !bytes.Equal(again, first) {
		t.Errorf("retry after failover = %s, want %s", again, first)
	}
	status, body, _ := payBody(t, b, "after-failover", strings.Replace(article, "invoice-7781", "invoice-after", 1))
	if status != 201 {
		t.Errorf("new payment after failover = %d %s", status, body)
	}
	// eu-west is still partitioned and must not serve.
	if status, body, _ := payBody(t, a, "after-failover", strings.Replace(article, "invoice-7781", "invoice-after", 1)); status == 201 {
		t.Errorf("partitioned eu-west served a moved tenant: %s", body)
	}

	link.Heal()
	waitFor(t, 30*time.Second, "eu-west to rejoin and forward", func() bool {
		status, body, h := payBody(t, a, "after-failover", strings.Replace(article, "invoice-7781", "invoice-after", 1))
		return status == 201 && h.Get("Idempotent-Replayed") == "true" && len(body) > 0
	})
	counts, err := prov.Charges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key, n := range counts.ByKey {
		if n != 1 {
			t.Errorf("%s charged %d times", key, n)
		}
	}
	rec, err := us.store.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "before-partition"})
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Errorf("us-east record of the pre-failover key = %+v, %v", rec, err)
	}
	if n := storetest.Count(t, eu.store, `SELECT count(*) FROM payments WHERE merchant_reference = 'invoice-after'`); n != 0 {
		t.Errorf("eu-west wrote %d payments for a tenant it no longer serves", n)
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// runRegion: idemctl region status|failover|handover.
func runRegion(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: idemctl region status|failover|handover [flags]")}
	}
	switch args[0] {
	case "status":
		return regionStatus(ctx, args[1:], env)
	case "failover":
		return regionFailover(ctx, args[1:], env)
	case "handover":
		return regionHandover(ctx, args[1:], env)
	}
	return usageError{fmt.Errorf("unknown region command %q (want status, failover or handover)", args[0])}
}

func regionFlags(name string, env *Env) (*flag.FlagSet, *etcdFlags) {
	fs := flag.NewFlagSet("region "+name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	return fs, etcdFlag(fs)
}

func parseRegionFlags(fs *flag.FlagSet, args []string, env *Env) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	return nil
}

type regionView struct {
	Region  string   `json:"region"`
	Nodes   []string `json:"nodes"`
	Tenants []string `json:"tenants"`
}

func regionStatus(ctx context.Context, args []string, env *Env) error {
	fs, endpoints := regionFlags("status", env)
	if err := parseRegionFlags(fs, args, env); err != nil {
		return err
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := routing.NewMap(ctx, c, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	byRegion := map[string]*regionView{}
	view := func(r string) *regionView {
		if byRegion[r] == nil {
			byRegion[r] = &regionView{Region: r, Nodes: m.Nodes(r), Tenants: []string{}}
		}
		return byRegion[r]
	}
	for _, p := range m.Placements() {
		v := view(p.Region)
		v.Tenants = append(v.Tenants, p.Tenant)
	}
	resp, err := c.Get(ctx, routing.RegionsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	for _, kv := range resp.Kvs {
		if region, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), routing.RegionsPrefix), "/"); ok {
			view(region)
		}
	}
	out := make([]regionView, 0, len(byRegion))
	for _, v := range byRegion {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return printJSON(env, out)
}

// regionFailover moves every tenant of --from to --to once --from has no
// live node left in etcd (waiting up to --wait for its leases to expire).
func regionFailover(ctx context.Context, args []string, env *Env) error {
	fs, endpoints := regionFlags("failover", env)
	from := fs.String("from", "", "region that failed (required)")
	to := fs.String("to", "", "region that takes over its tenants (required)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for --from's leases to expire in etcd")
	if err := parseRegionFlags(fs, args, env); err != nil {
		return err
	}
	if *from == "" || *to == "" {
		return usageError{errors.New("--from and --to are required")}
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(*wait)
	for {
		alive, err := routing.RegionAlive(ctx, c, *from)
		if err != nil {
			return err
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("region %s still holds a live lease after %v: a failover waits until the region has stopped serving (a partitioned region stops on its own once its lease runs out)", *from, *wait)
		}
		fmt.Fprintf(env.Stderr, "waiting for %s's leases to expire...\n", *from)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	moved, err := routing.MoveRegion(ctx, c, *from, *to, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "moved %d tenants from %s to %s; run 'idemctl region handover' once %s's store is reachable\n", len(moved), *from, *to, *from)
	return printJSON(env, moved)
}

// regionHandover merges the old region's records of moved tenants into the
// new home's store and ends their uncertainty window.
func regionHandover(ctx context.Context, args []string, env *Env) error {
	fs, endpoints := regionFlags("handover", env)
	from := fs.String("from", "", "region the tenants left (required)")
	to := fs.String("to", "", "region that is now their home (required)")
	fromURL := fs.String("from-database-url", "", "store of --from (required)")
	toURL := fs.String("to-database-url", "", "store of --to (required)")
	if err := parseRegionFlags(fs, args, env); err != nil {
		return err
	}
	if *from == "" || *to == "" || *fromURL == "" || *toURL == "" {
		return usageError{errors.New("--from, --to, --from-database-url and --to-database-url are required")}
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := routing.NewMap(ctx, c, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	src, err := store.Open(ctx, *fromURL, store.Options{})
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := store.Open(ctx, *toURL, store.Options{})
	if err != nil {
		return err
	}
	defer dst.Close()
	type tenantReport struct {
		Tenant string `json:"tenant"`
		store.HandoverReport
	}
	var reports []tenantReport
	conflicts := 0
	for _, p := range m.Placements() {
		f, ok := m.Failover(p.Tenant)
		if !ok || f.From != *from || f.To != *to || p.Region != *to {
			continue
		}
		rep, err := store.Handover(ctx, src, dst, p.Tenant)
		if err != nil {
			return err
		}
		if err := routing.MarkHandedOver(ctx, c, p.Tenant); err != nil {
			return err
		}
		conflicts += len(rep.Conflicts)
		reports = append(reports, tenantReport{Tenant: p.Tenant, HandoverReport: rep})
	}
	if err := printJSON(env, reports); err != nil {
		return err
	}
	if conflicts > 0 {
		return fmt.Errorf("%d conflicting records: both regions hold them with different meanings (listed above); the new home's records were kept", conflicts)
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// runRegion: idemctl region status|failover|failback|handover.
func runRegion(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: idemctl region status|failover|failback|handover [flags]")}
	}
	switch args[0] {
	case "status":
		return regionStatus(ctx, args[1:], env)
	case "failover":
		return regionFailover(ctx, args[1:], env)
	case "failback":
		return regionFailback(ctx, args[1:], env)
	case "handover":
		return regionHandover(ctx, args[1:], env)
	}
	return usageError{fmt.Errorf("unknown region command %q (want status, failover, failback or handover)", args[0])}
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
	Region string   `json:"region"`
	Nodes  []string `json:"nodes"`
	// Tenants are the tenants with a placement of their own whose
	// effective home is the region.
	Tenants []string `json:"tenants"`
	// Default is set when the region is in the default list: it is also
	// home to the unplaced tenants the default rule gives it.
	Default bool `json:"default,omitempty"`
	// Move is the region's indirection, if it was ever failed over.
	Move *routing.RegionMove `json:"move,omitempty"`
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
	for _, r := range m.DefaultRegions() {
		view(r).Default = true
	}
	for _, mv := range m.RegionMoves() {
		view(mv.Region).Move = &mv
		view(mv.ServedBy)
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

// regionFailover makes --to serve every tenant of --from once --from has no
// live node left in etcd (waiting up to --wait for its leases to expire):
// one write, whatever the number of tenants.
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
		mv, err := routing.MoveRegion(ctx, c, *from, *to, time.Now())
		if err == nil {
			fmt.Fprintf(env.Stderr, "%s's tenants are served by %s from epoch %d; run 'idemctl region handover --from %s --to %s' once %s's store is reachable\n",
				*from, *to, mv.Epoch, mv.From, *to, mv.From)
			return printJSON(env, mv)
		}
		if !errors.Is(err, routing.ErrRegionAlive) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v: a failover waits until the region has stopped serving (a partitioned region stops on its own once its lease runs out)", err, *wait)
		}
		fmt.Fprintf(env.Stderr, "waiting for %s's leases to expire...\n", *from)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// regionFailback makes --region serve its own tenants again after a
// failover: one write with a new epoch.
func regionFailback(ctx context.Context, args []string, env *Env) error {
	fs, endpoints := regionFlags("failback", env)
	region := fs.String("region", "", "region that takes its tenants back (required)")
	if err := parseRegionFlags(fs, args, env); err != nil {
		return err
	}
	if *region == "" {
		return usageError{errors.New("--region is required")}
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	mv, err := routing.FailBack(ctx, c, *region, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "%s serves its tenants again from epoch %d; run 'idemctl region handover --from %s --to %s' to merge what %s accepted meanwhile\n",
		*region, mv.Epoch, mv.From, *region, mv.From)
	return printJSON(env, mv)
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
	// The tenants: those with a placement of their own, and those the old
	// store holds records of (tenants homed by the default rule are named
	// nowhere else).
	tenants := map[string]bool{}
	for _, p := range m.Placements() {
		tenants[p.Tenant] = true
	}
	held, err := storeTenants(ctx, src)
	if err != nil {
		return err
	}
	for _, t := range held {
		tenants[t] = true
	}
	names := make([]string, 0, len(tenants))
	for t := range tenants {
		names = append(names, t)
	}
	sort.Strings(names)
	reports := []tenantReport{}
	conflicts := 0
	for _, tenant := range names {
		p, ok := m.Placement(tenant)
		if !ok || p.Region != *to {
			continue
		}
		f, ok := m.Failover(tenant)
		if !ok || f.To != *to || (f.From != *from && f.Region != *from) {
			continue
		}
		rep, err := store.Handover(ctx, src, dst, tenant)
		if err != nil {
			return err
		}
		if f.Region == "" {
			if err := routing.MarkHandedOver(ctx, c, tenant); err != nil {
				return err
			}
		}
		conflicts += len(rep.Conflicts)
		reports = append(reports, tenantReport{Tenant: tenant, HandoverReport: rep})
	}
	// One mark per region move: it ends the uncertainty of every tenant the
	// move took to --to, whatever their number.
	for _, mv := range m.RegionMoves() {
		if mv.ServedBy == *to && (mv.From == *from || mv.Region == *from) && !mv.HandedOver {
			if err := routing.MarkRegionHandedOver(ctx, c, mv); err != nil {
				return err
			}
		}
	}
	if err := printJSON(env, reports); err != nil {
		return err
	}
	if conflicts > 0 {
		return fmt.Errorf("%d conflicting records: both regions hold them with different meanings (listed above); the new home's records were kept", conflicts)
	}
	return nil
}

// storeTenants lists the tenants a store holds records or payments of.
func storeTenants(ctx context.Context, s *store.Store) ([]string, error) {
	rows, err := s.Pool().Query(ctx, `SELECT tenant_id FROM idempotency_records UNION SELECT tenant_id FROM payments`)
	if err != nil {
		return nil, fmt.Errorf("store: list tenants: %w", err)
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: list tenants: %w", err)
	}
	return tenants, nil
}

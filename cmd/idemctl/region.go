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

	"github.com/idemcoord/idem/failover"
	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/routing"
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
	said := false
	mv, err := failover.Move(ctx, c, *from, *to, *wait, func() {
		if !said {
			fmt.Fprintf(env.Stderr, "waiting for %s's leases to expire...\n", *from)
			said = true
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "%s's tenants are served by %s from epoch %d; run 'idemctl region handover --from %s --to %s' once %s's store is reachable\n",
		*from, *to, mv.Epoch, mv.From, *to, mv.From)
	return printJSON(env, mv)
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
	effectsURL := fs.String("effects-database-url", "", "database where the regions claim consumer effects (the nodes' --effects-database-url), so that --from's outbox, taken over here, produces each effect once")
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
	rep, err := failover.HandoverURLs(ctx, c, *from, *to, failover.Stores{From: *fromURL, To: *toURL, Effects: *effectsURL})
	if err != nil {
		return err
	}
	if err := printJSON(env, rep.Tenants); err != nil {
		return err
	}
	o := rep.Outbox
	fmt.Fprintf(env.Stderr, "%s's outbox: %d event(s) published, %d delivery(ies) consumed, %d receipt(s) sent; left: %d unpublished, %d pending, %d unsent, %d under a sender's claim\n",
		*from, o.Published, o.Consumed.Processed+o.Consumed.Duplicates+o.Consumed.Rejected, o.Sent,
		o.Left.Unpublished, o.Left.Pending, o.Left.Unsent, o.Left.Leased)
	if o.Left.Leased > 0 {
		fmt.Fprintf(env.Stderr, "a sender of %s died holding %d receipt(s): run the handover again once its claim has run out (at most %v)\n", *from, o.Left.Leased, outbox.SendLease)
	}
	if rep.Conflicts > 0 {
		return fmt.Errorf("%d conflicting records: both regions hold them with different meanings (listed above); the new home's records were kept", rep.Conflicts)
	}
	return nil
}

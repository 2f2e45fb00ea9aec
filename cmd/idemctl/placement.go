package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/routing"
)

// runPlacement: idemctl placement get|set --tenant T [--region R], or
// placement defaults [--regions A,B,C].
func runPlacement(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 || (args[0] != "get" && args[0] != "set" && args[0] != "defaults") {
		return usageError{errors.New("usage: idemctl placement get|set --tenant T [--region R] | defaults [--regions A,B,C] [--etcd-endpoints E]")}
	}
	verb := args[0]
	fs := flag.NewFlagSet("placement "+verb, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	endpoints := etcdFlag(fs)
	var tenant, region, regions *string
	if verb == "defaults" {
		regions = fs.String("regions", "", "comma-separated regions that home tenants without a placement (set once; without it, print the list)")
	} else {
		tenant = fs.String("tenant", "", "tenant (required)")
		region = fs.String("region", "", "new home region (set)")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	if verb != "defaults" && (*tenant == "" || (verb == "set" && *region == "")) {
		return usageError{errors.New("--tenant is required, and --region for set")}
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if verb == "defaults" {
		return placementDefaults(ctx, c, *regions, env)
	}
	var p routing.Placement
	if verb == "get" {
		var ok bool
		if p, ok, err = routing.GetPlacement(ctx, c, *tenant); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("tenant %q has no placement and no default region list is set (its first request places it in the receiving region)", *tenant)
		}
	} else if p, err = routing.MoveTenant(ctx, c, *tenant, *region, time.Now()); err != nil {
		return err
	}
	return printJSON(env, p)
}

// placementDefaults sets (once) or prints the default region list.
func placementDefaults(ctx context.Context, c *clientv3.Client, regions string, env *Env) error {
	var list []string
	var err error
	if regions == "" {
		if list, err = routing.GetDefaultRegions(ctx, c); err != nil {
			return err
		}
	} else {
		var want []string
		for _, r := range strings.Split(regions, ",") {
			if r = strings.TrimSpace(r); r != "" {
				want = append(want, r)
			}
		}
		if list, err = routing.SetDefaultRegions(ctx, c, want); err != nil {
			return err
		}
	}
	return printJSON(env, map[string][]string{"regions": list})
}

func printJSON(env *Env, v any) error {
	enc := json.NewEncoder(env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

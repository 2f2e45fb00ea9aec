package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/routing"
)

// runPlacement: idemctl placement get|set --tenant T [--region R].
func runPlacement(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 || (args[0] != "get" && args[0] != "set") {
		return usageError{errors.New("usage: idemctl placement get|set --tenant T [--region R] [--etcd-endpoints E]")}
	}
	verb := args[0]
	fs := flag.NewFlagSet("placement "+verb, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	endpoints := etcdFlag(fs)
	tenant := fs.String("tenant", "", "tenant (required)")
	region := fs.String("region", "", "new home region (set)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	if *tenant == "" || (verb == "set" && *region == "") {
		return usageError{errors.New("--tenant is required, and --region for set")}
	}
	c, err := dialEtcd(endpoints, env.Getenv)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var p routing.Placement
	if verb == "get" {
		var ok bool
		if p, ok, err = routing.GetPlacement(ctx, c, *tenant); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("tenant %q has no placement (its first request places it in the receiving region)", *tenant)
		}
	} else if p, err = routing.MoveTenant(ctx, c, *tenant, *region, time.Now()); err != nil {
		return err
	}
	return printJSON(env, p)
}

func printJSON(env *Env, v any) error {
	enc := json.NewEncoder(env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

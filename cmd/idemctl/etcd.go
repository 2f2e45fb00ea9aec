package main

import (
	"flag"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/etcdclient"
)

// etcdFlags are the flags of the commands that talk to etcd.
type etcdFlags struct {
	endpoints string
	etcdclient.Flags
}

// etcdFlag registers --etcd-endpoints and etcd's TLS and authentication
// flags on fs (defaults from IDEM_* through cli.ApplyEnv).
func etcdFlag(fs *flag.FlagSet) *etcdFlags {
	f := &etcdFlags{}
	fs.StringVar(&f.endpoints, "etcd-endpoints", "", "comma-separated etcd endpoints (or "+cli.EnvName("etcd-endpoints")+")")
	f.Register(fs)
	return f
}

// dialEtcd connects to the etcd of f; getenv reads IDEM_ETCD_PASSWORD. The
// caller closes the client.
func dialEtcd(f *etcdFlags, getenv func(string) string) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, usageError{fmt.Errorf("--etcd-endpoints (or %s) is required", cli.EnvName("etcd-endpoints"))}
	}
	cfg, err := f.Config(eps, getenv)
	if err != nil {
		return nil, usageError{err}
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return c, nil
}

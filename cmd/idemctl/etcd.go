package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idemcoord/idem/internal/cli"
)

// etcdFlag registers --etcd-endpoints on fs (default from IDEM_ETCD_ENDPOINTS
// through cli.ApplyEnv).
func etcdFlag(fs *flag.FlagSet) *string {
	return fs.String("etcd-endpoints", "", "comma-separated etcd endpoints (or "+cli.EnvName("etcd-endpoints")+")")
}

// dialEtcd connects to the endpoints of an --etcd-endpoints value. The caller
// closes the client.
func dialEtcd(endpoints string) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, usageError{fmt.Errorf("--etcd-endpoints (or %s) is required", cli.EnvName("etcd-endpoints"))}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return c, nil
}

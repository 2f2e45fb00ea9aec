package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem/internal/pgha"
	"github.com/idemcoord/idem/internal/pgserver"
)

// StoreInfo describes the replicated store of Config.StoreHA in
// cluster.json.
type StoreInfo struct {
	// Members are the store's members, one per region, in region order.
	Members []StoreMember `json:"members"`
}

// StoreMember is one member of the replicated store.
type StoreMember struct {
	// Name is the member's Patroni name, "store-<region>".
	Name string `json:"name"`
	// Region is the region the member stands for.
	Region string `json:"region"`
	// URL is the member's own database URL, without its password (which is
	// in the region's databaseUrl, a multi-host URL naming every member).
	URL string `json:"url"`
	// APIURL is the member's Patroni REST API (GET /leader, /cluster).
	APIURL string `json:"apiUrl"`
}

// StoreMemberName returns the name of region's member of the replicated
// store: "store-<region>". In a proxied cluster its links are
//
//	store-<region>->etcd-m<j>   its Patroni agent's connections to etcd member j
//	->store-<region>            replicas' connections to its PostgreSQL server
//	->store-<region>-api        other agents' connections to its REST API
func StoreMemberName(region string) string { return "store-" + region }

// haDatabase is the database the replicated store of Config.StoreHA holds:
// GlobalDatabase in global mode, EffectsDatabase in region-local mode.
func haDatabase(cfg *Config) string {
	if cfg.StoreMode == StoreGlobal {
		return GlobalDatabase
	}
	return EffectsDatabase
}

// startStoreHA starts the replicated store of Config.StoreHA (etcd must
// run). In global mode it returns region -> the multi-host URL of
// GlobalDatabase; in region-local mode it holds EffectsDatabase, whose
// multi-host URL becomes the nodes' effects database, and returns nil.
func (c *Cluster) startStoreHA(ctx context.Context, cfg *Config) (map[string]string, error) {
	dir := ""
	if !c.removeState {
		var err error
		if dir, err = c.serverDir("store-ha"); err != nil {
			return nil, err
		}
	}
	var hosts []string
	for _, m := range c.EtcdMembers() {
		hosts = append(hosts, m.Addr())
	}
	db := haDatabase(cfg)
	c.haDatabase = db
	opts := pgha.Options{Dir: dir, EtcdHosts: hosts, Database: db, Logger: c.log}
	if ttl := cfg.StoreHATTL; ttl != 0 {
		// Patroni wants loop_wait + 2*retry_timeout <= ttl.
		opts.TTL, opts.LoopWait = ttl, pgha.DefaultLoopWait
		opts.RetryTimeout = min(pgha.DefaultRetryTimeout, (ttl-pgha.DefaultLoopWait)/2/time.Second*time.Second)
	}
	if c.tls != nil {
		// Each member's certificate, from the cluster's CA, serves its
		// PostgreSQL and authenticates its agent to etcd.
		opts.TLS = func(member string) (pgha.TLSFiles, error) {
			cert, key, err := c.tls.issue(member, nil)
			if err != nil {
				return pgha.TLSFiles{}, err
			}
			return pgha.TLSFiles{CAFile: c.tls.ca.CertFile, CertFile: cert, KeyFile: key}, nil
		}
		opts.APIClientTLS = c.ClientTLS()
	}
	for _, r := range cfg.Regions {
		spec := pgha.MemberSpec{Name: StoreMemberName(r), Region: r}
		if c.net != nil {
			for _, m := range c.EtcdMembers() {
				l, err := c.net.set(spec.Name, m.Name(), m.Addr())
				if err != nil {
					return nil, err
				}
				spec.EtcdHosts = append(spec.EtcdHosts, l.Listen)
			}
		}
		opts.Members = append(opts.Members, spec)
	}
	if c.net != nil {
		opts.Advertise = func(name string, port, apiPort int) (string, string, error) {
			pg, err := c.net.set("", name, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				return "", "", err
			}
			api, err := c.net.set("", name+"-api", net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))
			if err != nil {
				return "", "", err
			}
			return pg.Listen, api.Listen, nil
		}
	}
	s, err := pgha.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("cluster: start the replicated store: %w", err)
	}
	c.store = s
	if db == EffectsDatabase {
		c.effectsURL = s.URL(EffectsDatabase)
		return nil, nil
	}
	out := make(map[string]string, len(cfg.Regions))
	for _, r := range cfg.Regions {
		out[r] = s.URL(GlobalDatabase)
	}
	return out, nil
}

// serverDir returns <StateDir>/<name> for a PostgreSQL server's data, or,
// when the server's OS user cannot reach it, the directory pgserver.DirFor
// gives, which <StateDir>/<name> then links to.
func (c *Cluster) serverDir(name string) (string, error) {
	asked := filepath.Join(c.stateDir, name)
	dir, err := pgserver.DirFor(asked)
	if err != nil {
		return "", fmt.Errorf("cluster: %s directory: %w", name, err)
	}
	if dir == asked {
		return dir, nil
	}
	c.log.Info("cluster: the postgres OS user cannot reach the state directory; the data is kept elsewhere", "dir", dir, "link", asked)
	if _, err := os.Lstat(asked); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(dir, asked); err != nil {
			return "", fmt.Errorf("cluster: link to %s: %w", dir, err)
		}
	}
	return dir, nil
}

// Store returns the replicated store of Config.StoreHA (its members, their
// leader, Kill and Start), or nil.
func (c *Cluster) Store() *pgha.Cluster { return c.store }

// StoreURL returns the multi-host URL of the replicated store's database
// (GlobalDatabase, or EffectsDatabase in region-local mode), as the nodes
// use it, or "" without Config.StoreHA.
func (c *Cluster) StoreURL() string {
	if c.store == nil {
		return ""
	}
	return c.store.URL(c.haDatabase)
}

func (c *Cluster) storeInfo() *StoreInfo {
	if c.store == nil {
		return nil
	}
	si := &StoreInfo{Members: []StoreMember{}}
	for _, m := range c.store.Members() {
		si.Members = append(si.Members, StoreMember{Name: m.Name, Region: m.Region, URL: m.URL(c.haDatabase), APIURL: m.APIURL()})
	}
	return si
}

// isMultiHost reports whether dbURL names several hosts.
func isMultiHost(dbURL string) bool {
	u, err := url.Parse(dbURL)
	return err == nil && strings.Contains(u.Host, ",")
}

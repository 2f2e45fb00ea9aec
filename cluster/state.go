package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Info describes a running cluster; it is what cluster.json holds.
type Info struct {
	// Regions lists the regions in Config order.
	Regions []RegionInfo `json:"regions"`
	// DatabaseURL is the first region's database.
	DatabaseURL string `json:"databaseUrl"`
	// StoreMode is StoreRegionLocal or StoreGlobal.
	StoreMode string `json:"storeMode"`
	// EtcdEndpoints are the etcd members' client URLs (empty without etcd).
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// ProviderURL is the provider simulator's base URL ("" without it).
	ProviderURL string `json:"providerUrl"`
	// ProviderAdminKey is the key the provider simulator's /admin
	// endpoints (faults, charge counts) require as a bearer token ("" without
	// the simulator).
	ProviderAdminKey string `json:"providerAdminKey"`
	// Tokens maps each tenant to its development bearer token.
	Tokens map[string]string `json:"tokens"`
	// AdminTokenFile is the file holding the nodes' admin token (named
	// operator), for idemctl records --node --admin-token-file.
	AdminTokenFile string `json:"adminTokenFile"`
	// Placements maps each tenant to its home region as Start placed it
	// (empty without etcd, where every region serves every tenant).
	Placements map[string]string `json:"placements"`
	// Store lists the members of the replicated store of Config.StoreHA
	// (omitted without).
	Store *StoreInfo `json:"store,omitempty"`
	// CAFile is the path of the CA certificate that signs every
	// certificate of a cluster with Config.TLS (omitted without).
	CAFile string `json:"caFile,omitempty"`
	// Operations are the operations every node's coordination API serves
	// (Config.Operations; omitted without).
	Operations []string `json:"operations,omitempty"`
	// EffectsDatabaseURL is the database where the regions' consumers
	// claim their effects (EffectsDatabase, the nodes'
	// --effects-database-url); omitted when the cluster has none (one
	// region, or global store mode, where the store is that database).
	EffectsDatabaseURL string `json:"effectsDatabaseUrl,omitempty"`
	// PgBouncer describes the PgBouncer of Config.PgBouncer, which every
	// database URL above goes through (omitted without).
	PgBouncer *PgBouncerInfo `json:"pgbouncer,omitempty"`
}

// RegionInfo describes one region of a running cluster.
type RegionInfo struct {
	Name string `json:"name"`
	// URL is the first node's base URL.
	URL string `json:"url"`
	// Nodes lists every node's base URL, in index order.
	Nodes []string `json:"nodes"`
	// Pids lists every node's process id when the state was written, in
	// index order (for an operator's drill commands: kill -STOP, kill -9).
	Pids []int `json:"pids,omitempty"`
	// DatabaseURL is the region's database (GlobalDatabase's in global
	// store mode). Nodes of a proxied cluster reach it through their links.
	// With Config.PgBouncer it is the URL through PgBouncer.
	DatabaseURL string `json:"databaseUrl"`
}

// prepareStateDir creates the state directory (or a temporary one) and its
// logs directory, and removes a cluster.json left by an earlier run.
func (c *Cluster) prepareStateDir(dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "idem-cluster-")
		if err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		c.stateDir, c.removeState = d, true
	} else {
		d, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cluster: state directory: %w", err)
		}
		c.stateDir = d
		// A stale cluster.json would announce endpoints that are gone.
		if err := os.Remove(filepath.Join(d, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cluster: remove stale %s: %w", StateFile, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(c.stateDir, "logs"), 0o755); err != nil {
		return fmt.Errorf("cluster: logs directory: %w", err)
	}
	return nil
}

// Info returns the cluster's endpoints, databases, tokens and placements.
// The result is a copy the caller may keep.
func (c *Cluster) Info() Info {
	info := Info{
		StoreMode:      c.storeMode,
		EtcdEndpoints:  c.EtcdEndpoints(),
		ProviderURL:    c.ProviderURL(),
		Tokens:         maps.Clone(c.tokens),
		AdminTokenFile: c.secrets.adminToken,
		Placements:     maps.Clone(c.placements),
		CAFile:         c.CAFile(),
		Store:          c.storeInfo(),
		Operations:     slices.Clone(c.operations),
		PgBouncer:      c.pgBouncerInfo(),
	}
	if c.storeMode != StoreGlobal {
		info.EffectsDatabaseURL = c.effectsURL
	}
	if c.provider != nil {
		info.ProviderAdminKey = c.secrets.adminKey
	}
	if info.Tokens == nil {
		info.Tokens = map[string]string{}
	}
	if info.Placements == nil {
		info.Placements = map[string]string{}
	}
	for _, r := range c.regions {
		ri := RegionInfo{Name: r.name, DatabaseURL: r.dbURL, Nodes: []string{}}
		for _, p := range r.nodes {
			ri.Nodes = append(ri.Nodes, p.URL())
			ri.Pids = append(ri.Pids, p.Pid())
		}
		if len(ri.Nodes) > 0 {
			ri.URL = ri.Nodes[0]
		}
		info.Regions = append(info.Regions, ri)
	}
	if len(c.regions) > 0 {
		info.DatabaseURL = c.regions[0].dbURL
	}
	return info
}

// WriteState writes Info as indented JSON to path atomically: to a
// temporary file in the same directory, then renamed over path. The file
// has mode 0600, as it holds bearer tokens.
func (c *Cluster) WriteState(path string) error {
	b, err := json.MarshalIndent(c.Info(), "", "  ")
	if err != nil {
		return fmt.Errorf("cluster: write state: %w", err)
	}
	b = append(b, '\n')
	return writeFileAtomic(path, b)
}

// writeFileAtomic writes b to path atomically: to a temporary file in the
// same directory, with mode 0600, then renamed over path.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cluster: write %s: %w", filepath.Base(path), err)
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("cluster: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// StateDir returns the absolute path of the state directory.
func (c *Cluster) StateDir() string { return c.stateDir }

// StatePath returns the path of the cluster.json that Start wrote.
func (c *Cluster) StatePath() string { return filepath.Join(c.stateDir, StateFile) }

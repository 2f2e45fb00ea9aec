package cluster

import (
	"context"
	"fmt"
	"path/filepath"
)

// startProvider starts the provider simulator and waits for its /healthz.
func (c *Cluster) startProvider(ctx context.Context, cfg *Config) error {
	dir := filepath.Join(c.stateDir, "provider")
	args := []string{"--data-dir", dir}
	if c.tls != nil {
		cert, key, err := c.tls.issue(KindProvider, nil)
		if err != nil {
			return err
		}
		args = append(args, "--tls-cert", cert, "--tls-key", key)
	}
	p := &Process{
		kind: KindProvider,
		name: KindProvider,
		path: cfg.IdemctlPath,
		argv: func(addr string) []string {
			return append([]string{"provider", "--listen", addr,
				"--api-key-file", c.secrets.providerAPIKey, "--admin-key-file", c.secrets.providerAdminKey}, args...)
		},
		env:          nodeEnv(nil),
		readyPath:    "/healthz",
		logPath:      filepath.Join(c.stateDir, "logs", "provider.log"),
		readyTimeout: cfg.ReadyTimeout,
		stopGrace:    cfg.StopGrace,
		log:          c.log,
		scheme:       c.scheme(),
		tlsConfig:    c.ClientTLS(),
	}
	if c.docker != nil {
		p.ctr = c.docker.newContainer(KindProvider, servicesNet, c.docker.image)
		p.addr = fmt.Sprintf("%s:%d", p.ctr.nets[0].ip, dockerProviderPort)
	}
	c.provider = p
	return firstStart(ctx, p)
}

// Provider returns the provider simulator's process, or nil without
// Config.Provider.
func (c *Cluster) Provider() *Process { return c.provider }

// ProviderAdminKey returns the key the provider simulator's /admin
// endpoints require (provider.Client.AdminKey), or "" without
// Config.Provider.
func (c *Cluster) ProviderAdminKey() string {
	if c.provider == nil {
		return ""
	}
	return c.secrets.adminKey
}

// ProviderURL returns the provider simulator's base URL, as the cluster
// itself reaches it, or "" without Config.Provider.
func (c *Cluster) ProviderURL() string {
	if c.provider == nil {
		return ""
	}
	return c.provider.URL()
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemcoord/idem/cluster"
)

// healthProbeTimeout bounds one health probe.
const healthProbeTimeout = 2 * time.Second

// checkHealth probes every node's /readyz, every etcd member's /health,
// the provider's /healthz and PgBouncer (a connection through it, when the
// nodes reach their store through one), directly (never through a link),
// and returns
// one error per process that is not healthy. Nodes of the regions env
// lost for good (RegionLost) are left out.
func checkHealth(ctx context.Context, c *cluster.Cluster, env *Env) error {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: c.ClientTLS()}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: healthProbeTimeout}
	var errs []error
	for _, p := range c.Nodes() {
		if env.Lost(p.Region()) {
			continue
		}
		if err := probe(ctx, client, p.URL()+"/readyz", ""); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", p.Name(), err))
		}
	}
	for _, p := range c.EtcdMembers() {
		if err := probe(ctx, client, p.URL()+"/health", `"true"`); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
		}
	}
	if u := c.ProviderURL(); u != "" {
		if err := probe(ctx, client, u+"/healthz", ""); err != nil {
			errs = append(errs, fmt.Errorf("provider: %w", err))
		}
	}
	if err := checkPgBouncer(ctx, c); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// probe GETs url and wants 200 (and want in the body, if set).
func probe(ctx context.Context, client *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if want != "" && !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %s", url, strings.TrimSpace(string(body)))
	}
	return nil
}

// waitHealthy polls checkHealth until it passes or timeout passes, and
// returns the last error.
func waitHealthy(ctx context.Context, c *cluster.Cluster, env *Env, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := checkHealth(ctx, c, env)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

package pgha

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ErrNoLeader is returned, wrapped, by Leader when no member holds the
// leader key.
var ErrNoLeader = errors.New("pgha: no member is the leader")

// Roles of MemberStatus.Role, as Patroni's GET /cluster reports them.
const (
	RoleLeader      = "leader"
	RoleSyncStandby = "sync_standby"
	RoleReplica     = "replica"
)

type httpClient struct{ c *http.Client }

// newHTTPClient calls the agents' REST API, over TLS with cfg when it is
// not nil.
func newHTTPClient(cfg *tls.Config) *httpClient {
	return &httpClient{c: &http.Client{Timeout: apiTimeout, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg}}}
}

// get returns the status code and body of GET url.
func (h *httpClient) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("pgha: %w", err)
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("pgha: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("pgha: %w", err)
	}
	return resp.StatusCode, b, nil
}

// IsLeader asks the member's agent (GET /leader) whether it holds the
// leader key.
func (m *Member) IsLeader(ctx context.Context) (bool, error) {
	code, _, err := m.c.http.get(ctx, m.APIURL()+"/leader")
	if err != nil {
		return false, err
	}
	return code == http.StatusOK, nil
}

// Leader returns the member that holds the leader key according to its
// own agent (GET /leader answers 200), or an error wrapping ErrNoLeader.
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	for _, m := range c.members {
		if !m.Running() {
			continue
		}
		if ok, err := m.IsLeader(ctx); err == nil && ok {
			return m, nil
		}
	}
	return nil, ErrNoLeader
}

// MemberStatus is one member as GET /cluster reports it.
type MemberStatus struct {
	Name     string `json:"name"`
	Role     string `json:"role"`
	State    string `json:"state"`
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"`
}

// Status returns the members as the first running agent that answers GET
// /cluster sees them (from etcd).
func (c *Cluster) Status(ctx context.Context) ([]MemberStatus, error) {
	var errs []error
	for _, m := range c.members {
		if !m.Running() {
			continue
		}
		code, b, err := c.http.get(ctx, m.APIURL()+"/cluster")
		if err != nil || code != http.StatusOK {
			errs = append(errs, fmt.Errorf("pgha: GET /cluster of %s: %d %w", m.Name, code, err))
			continue
		}
		var out struct {
			Members []MemberStatus `json:"members"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("pgha: GET /cluster of %s: %w", m.Name, err)
		}
		return out.Members, nil
	}
	return nil, errors.Join(append(errs, errors.New("pgha: no agent answered GET /cluster"))...)
}

// healthy reports whether st has a leader, a synchronous standby and
// want running members.
func healthy(st []MemberStatus, want int) bool {
	var leader, sync, running int
	for _, m := range st {
		switch m.Role {
		case RoleLeader:
			leader++
		case RoleSyncStandby:
			sync++
		}
		if m.State == "running" || m.State == "streaming" {
			running++
		}
	}
	return leader == 1 && sync >= 1 && running == want
}

// WaitHealthy waits until every running member runs its server, one of
// them is the leader (and answers GET /leader) and one a synchronous
// standby, so that the store acknowledges commits again.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	var last []MemberStatus
	var lastErr error
	for {
		want := 0
		for _, m := range c.members {
			if m.Running() {
				want++
			}
		}
		st, err := c.Status(ctx)
		if err == nil && healthy(st, want) {
			if _, err = c.Leader(ctx); err == nil {
				return nil
			}
		}
		if err == nil {
			last = st
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgha: waiting for a leader, a synchronous standby and %d running members: %w (last status %+v, last error %v)", want, ctx.Err(), last, lastErr)
		case <-t.C:
		}
	}
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"github.com/idemcoord/idem/internal/pgbouncer"
	"github.com/idemcoord/idem/internal/pgserver"
)

// PgBouncerLog is the name, in the logs directory, of PgBouncer's log (a
// link to the file PgBouncer writes in its own directory).
const PgBouncerLog = "pgbouncer.log"

// PgBouncerInfo describes the PgBouncer of Config.PgBouncer.
type PgBouncerInfo struct {
	// Addr is where PgBouncer listens (127.0.0.1:port); every database
	// URL of Info goes through it.
	Addr string `json:"addr"`
	// PoolMode is its pool_mode: "transaction".
	PoolMode string `json:"poolMode"`
	// ServerURL is the PostgreSQL server behind it, reached directly (its
	// postgres database), for an operator's psql.
	ServerURL string `json:"serverUrl"`
	// Pid is PgBouncer's process id when the state was written.
	Pid int `json:"pid"`
	// Log is PgBouncer's log file.
	Log string `json:"log"`
}

// startPgBouncer starts PgBouncer in transaction pooling in front of the
// PostgreSQL server Start runs, and returns urls (region -> database URL)
// and c.effectsURL rewritten to go through it.
func (c *Cluster) startPgBouncer(ctx context.Context, urls map[string]string) (map[string]string, error) {
	if c.pg == nil {
		return nil, errors.New("cluster: PgBouncer needs the PostgreSQL server Start runs")
	}
	server, err := url.Parse(c.pg.URL())
	if err != nil {
		return nil, fmt.Errorf("cluster: PgBouncer: %w", err)
	}
	dir := "" // a temporary directory of its own, removed by Stop
	if !c.removeState {
		// In the state directory, or where PostgreSQL's OS user can reach
		// when it cannot (see postgresDir).
		if dir, err = pgserver.DirFor(filepath.Join(c.stateDir, "pgbouncer")); err != nil {
			return nil, fmt.Errorf("cluster: PgBouncer directory: %w", err)
		}
	}
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{
		Upstream: server.Host,
		User:     server.User.Username(),
		PoolMode: pgbouncer.ModeTransaction,
		Dir:      dir,
		Logger:   c.log,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: start PgBouncer: %w", err)
	}
	c.bouncer = b
	// The log goes with the cluster's: logs/pgbouncer.log links to it.
	link := filepath.Join(c.stateDir, "logs", PgBouncerLog)
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cluster: PgBouncer's log: %w", err)
	}
	if err := os.Symlink(b.LogPath(), link); err != nil {
		return nil, fmt.Errorf("cluster: PgBouncer's log: %w", err)
	}
	out := make(map[string]string, len(urls))
	for r, u := range urls {
		if out[r], err = b.Via(u); err != nil {
			return nil, err
		}
	}
	if c.effectsURL != "" {
		if c.effectsURL, err = b.Via(c.effectsURL); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PgBouncer returns the PgBouncer every node reaches the store through
// (Config.PgBouncer), or nil. A fault may Kill it (SIGKILL: every client
// and server connection drops, commits in flight with them) and Restart it
// on the same port; the nodes' URLs stay valid.
func (c *Cluster) PgBouncer() *pgbouncer.Server { return c.bouncer }

// pgBouncerInfo describes c.bouncer for Info (nil without one).
func (c *Cluster) pgBouncerInfo() *PgBouncerInfo {
	if c.bouncer == nil {
		return nil
	}
	return &PgBouncerInfo{
		Addr:      fmt.Sprintf("127.0.0.1:%d", c.bouncer.Port()),
		PoolMode:  pgbouncer.ModeTransaction,
		ServerURL: c.pg.URL(),
		Pid:       c.bouncer.Pid(),
		Log:       filepath.Join(c.stateDir, "logs", PgBouncerLog),
	}
}

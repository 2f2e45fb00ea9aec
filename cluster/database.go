package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemcoord/idem/internal/pgserver"
)

// SQLSTATEs that createDatabases tolerates.
const (
	codeDuplicateDatabase     = "42P04"
	codeInsufficientPrivilege = "42501"
)

// storeSettings returns the cluster's PostgreSQL settings beyond pgserver's.
// shared_buffers: PostgreSQL's default of 128 MB keeps little of the
// indexes of random keys (records, payments) that every write visits, so
// the rest is read from the kernel's page cache, which the kernel may
// reclaim (docs/chaos.md, "One hour"). Pages are allocated as they are
// used, so a small cluster does not take the whole gigabyte.
func storeSettings() map[string]string { return map[string]string{"shared_buffers": "1GB"} }

// startStore starts PostgreSQL (unless cfg.DatabaseURL names a server),
// creates the databases and returns region -> database URL.
func (c *Cluster) startStore(ctx context.Context, cfg *Config) (map[string]string, error) {
	admin := cfg.DatabaseURL
	if c.docker != nil {
		var err error
		if admin, err = c.startStoreDocker(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if admin == "" {
		pgDir := ""
		if !c.removeState {
			var err error
			if pgDir, err = c.postgresDir(); err != nil {
				return nil, err
			}
		}
		pg, err := pgserver.Start(ctx, pgserver.Options{Dir: pgDir, Logger: c.log, TLS: cfg.TLS, Settings: storeSettings()})
		if err != nil {
			return nil, fmt.Errorf("cluster: start PostgreSQL: %w", err)
		}
		c.pg = pg
		admin = pg.URL()
	}
	dbOf := make(map[string]string, len(cfg.Regions)) // region -> database name
	var names []string
	for _, r := range cfg.Regions {
		name := DatabaseName(r)
		if cfg.StoreMode == StoreGlobal {
			name = GlobalDatabase
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		dbOf[r] = name
	}
	if cfg.StoreMode != StoreGlobal && len(cfg.Regions) > 1 && !cfg.StoreHA {
		// Region-local stores: consumer effects are claimed once across
		// regions in a database they all see (idemd --effects-database-url;
		// with StoreHA, the replicated store holds it).
		names = append(names, EffectsDatabase)
	}
	urls, err := createDatabases(ctx, c.log, admin, names)
	if err != nil {
		return nil, err
	}
	if u, ok := urls[EffectsDatabase]; ok {
		c.effectsURL = u
		if c.pg != nil && cfg.TLS {
			c.effectsURL = c.pg.TLSURLFor(EffectsDatabase)
		}
	}
	out := make(map[string]string, len(dbOf))
	for r, name := range dbOf {
		out[r] = urls[name]
		if c.pg != nil && cfg.TLS {
			// Nodes reach the store over TLS, verifying its certificate.
			out[r] = c.pg.TLSURLFor(name)
		}
	}
	return out, nil
}

// postgresDir returns the directory of the PostgreSQL server of a kept
// state directory: <StateDir>/postgres, or, when the server's OS user cannot
// reach it (running as root in a home directory of mode 0700, say), the
// stable directory pgserver.DirFor gives, which <StateDir>/postgres then
// links to so that it can be found.
func (c *Cluster) postgresDir() (string, error) {
	asked := filepath.Join(c.stateDir, "postgres")
	dir, err := pgserver.DirFor(asked)
	if err != nil {
		return "", fmt.Errorf("cluster: PostgreSQL directory: %w", err)
	}
	if dir == asked {
		return dir, nil
	}
	c.log.Info("cluster: the postgres OS user cannot reach the state directory; PostgreSQL's data is kept elsewhere", "dir", dir, "link", asked)
	if _, err := os.Lstat(asked); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(dir, asked); err != nil {
			return "", fmt.Errorf("cluster: link to PostgreSQL's directory: %w", err)
		}
	}
	return dir, nil
}

// proxyDatabase creates the link node->store and returns dbURL with the
// link's address as its host.
func (c *Cluster) proxyDatabase(node, dbURL string) (string, error) {
	return c.proxyDatabaseAs(node, EndpointStore, dbURL)
}

// proxyDatabaseAs is proxyDatabase for the link node->endpoint.
func (c *Cluster) proxyDatabaseAs(node, endpoint, dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" || strings.Contains(u.Host, ",") {
		return "", fmt.Errorf("cluster: Proxied needs a postgres://user@host:port/db database URL with one host, not %s", redact(dbURL))
	}
	upstream := u.Host
	if u.Port() == "" {
		upstream = net.JoinHostPort(u.Hostname(), "5432")
	}
	l, err := c.net.set(node, endpoint, upstream)
	if err != nil {
		return "", err
	}
	u.Host = l.Listen
	return u.String(), nil
}

// EffectsDatabase is the database, in region-local store mode with more
// than one region, where every region's consumers claim their effects
// (idemd --effects-database-url).
const EffectsDatabase = "idem_effects"

// DatabaseName returns the database of a region in region-local store
// mode: idem_ followed by the region name with "-" replaced by "_".
func DatabaseName(region string) string {
	return "idem_" + strings.ReplaceAll(region, "-", "_")
}

// createDatabases creates the databases named on the server at admin and
// returns name -> database URL. A database that exists already is reused.
// When a single database is needed and admin is not a postgres:// URL, or
// its role may not create databases, that database is admin itself.
func createDatabases(ctx context.Context, log *slog.Logger, admin string, names []string) (map[string]string, error) {
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		if len(names) == 1 {
			log.Warn("cluster: database is not a postgres:// URL; it is used as it is", "database", names[0])
			return map[string]string{names[0]: admin}, nil
		}
		return nil, fmt.Errorf("cluster: database URL %s: want postgres://user@host:port/db to create a database per region", redact(admin))
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect to %s: %w", redact(admin), err)
	}
	defer conn.Close(context.Background())
	urls := make(map[string]string, len(names))
	for _, name := range names {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			log.Info("cluster: created database", "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeDuplicateDatabase:
			log.Info("cluster: reusing database", "database", name)
		case errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege && len(names) == 1:
			log.Warn("cluster: may not create databases; using the given database", "instead_of", name, "err", err)
			urls[name] = admin
			continue
		default:
			return nil, fmt.Errorf("cluster: create database %s: %w", name, err)
		}
		du := *u
		du.Path, du.RawPath = "/"+name, ""
		urls[name] = du.String()
	}
	return urls, nil
}

// redact hides the password of a URL for error messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// PostgresPid returns the process id of the PostgreSQL server the cluster
// started, or 0 if it uses Config.DatabaseURL.
func (c *Cluster) PostgresPid() int {
	if c.pg == nil {
		return 0
	}
	return c.pg.Pid()
}

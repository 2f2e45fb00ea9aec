package pgha

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// memberConfig is what a member's patroni.yml says.
type memberConfig struct {
	Scope, Namespace, Name      string
	APIPort, Port               int
	Advertise                   string // host:port of PostgreSQL for replicas
	APIAdvertise                string // host:port of the REST API for other agents
	EtcdHosts                   []string
	Dir, BinDir                 string
	Password, ReplPassword      string
	TTL, LoopWait, RetryTimeout int
	// SyncStandbys is synchronous_node_count: how many standbys every
	// commit waits for (each of the others, see Start).
	SyncStandbys int
	// TLS, if set, is the member's copy of its files (see Options.TLS).
	TLS *TLSFiles
}

// q quotes s as a YAML double-quoted scalar.
func q(s string) string { return strconv.Quote(s) }

// yaml returns the member's Patroni configuration. Commits wait for
// SyncStandbys synchronous standbys (strict synchronous mode); only those
// may be promoted, and an old primary rejoins with pg_rewind. A standby
// whose stream breaks asks again after a second
// (wal_retrieve_retry_interval; PostgreSQL's default is 5s), which is how
// soon a promoted primary has made its slot. use_proxies keeps
// the agent on the etcd endpoints it is given (they may be proxies)
// instead of the member list etcd advertises.
func (m memberConfig) yaml() []byte {
	hosts := make([]string, len(m.EtcdHosts))
	for i, h := range m.EtcdHosts {
		hosts[i] = q(h)
	}
	data := filepath.Join(m.Dir, "data")
	// Without TLS: plain HTTP to etcd, plain TCP between the members.
	etcdTLS, hostType, serverSSL, clientSSL, apiTLS := "protocol: http", "host", "", "", ""
	if t := m.TLS; t != nil {
		// The REST API serves HTTPS and takes only callers with a
		// certificate of the CA (the other agents, which present theirs:
		// Patroni's client falls back to restapi's files, and the
		// cluster's controller).
		apiTLS = fmt.Sprintf("\n  certfile: %s\n  keyfile: %s\n  cafile: %s\n  verify_client: required", q(t.CertFile), q(t.KeyFile), q(t.CAFile))
		// etcd verified and authenticating the agent; PostgreSQL refusing
		// TCP without TLS; replicas (and pg_rewind) verifying the server
		// they stream from. libpq ignores sslmode on the Unix socket the
		// agent uses for its own server.
		etcdTLS = fmt.Sprintf("protocol: https\n  cacert: %s\n  cert: %s\n  key: %s", q(t.CAFile), q(t.CertFile), q(t.KeyFile))
		hostType = "hostssl"
		serverSSL = fmt.Sprintf("\n    ssl: \"on\"\n    ssl_cert_file: %s\n    ssl_key_file: %s", q(t.CertFile), q(t.KeyFile))
		clientSSL = fmt.Sprintf("\n      sslmode: verify-full\n      sslrootcert: %s", q(t.CAFile))
	}
	return fmt.Appendf(nil, `scope: %s
namespace: %s
name: %s
log:
  level: INFO
restapi:
  listen: %s
  connect_address: %s%s
etcd3:
  hosts: [%s]
  %s
  use_proxies: true
bootstrap:
  dcs:
    ttl: %d
    loop_wait: %d
    retry_timeout: %d
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: true
    synchronous_node_count: %d
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
        wal_keep_size: 128MB
        synchronous_commit: "on"
        fsync: "off"
        full_page_writes: "on"
        wal_retrieve_retry_interval: 1s
  initdb:
    - encoding: UTF8
    - no-locale
    - auth-local: trust
postgresql:
  listen: %s
  connect_address: %s
  data_dir: %s
  bin_dir: %s
  pgpass: %s
  use_unix_socket: true
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  pg_hba:
    - local all all trust
    - %s replication %s 127.0.0.1/32 scram-sha-256
    - %s all all 127.0.0.1/32 scram-sha-256
  authentication:
    superuser:
      username: %s
      password: %s%s
    replication:
      username: %s
      password: %s%s
  parameters:
    unix_socket_directories: %s
    password_encryption: scram-sha-256%s
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
`,
		q(m.Scope), q(m.Namespace), q(m.Name),
		q("127.0.0.1:"+strconv.Itoa(m.APIPort)), q(m.APIAdvertise), apiTLS,
		strings.Join(hosts, ", "), etcdTLS,
		m.TTL, m.LoopWait, m.RetryTimeout, max(m.SyncStandbys, 1),
		q("127.0.0.1:"+strconv.Itoa(m.Port)), q(m.Advertise), q(data), q(m.BinDir), q(filepath.Join(m.Dir, "pgpass")),
		hostType, replicator, hostType,
		q(Superuser), q(m.Password), clientSSL, q(replicator), q(m.ReplPassword), clientSSL,
		q(m.Dir), serverSSL,
	)
}

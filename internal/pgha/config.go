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
}

// q quotes s as a YAML double-quoted scalar.
func q(s string) string { return strconv.Quote(s) }

// yaml returns the member's Patroni configuration. Commits wait for one
// synchronous standby (strict synchronous mode); only that standby may be
// promoted, and an old primary rejoins with pg_rewind. use_proxies keeps
// the agent on the etcd endpoints it is given (they may be proxies)
// instead of the member list etcd advertises.
func (m memberConfig) yaml() []byte {
	hosts := make([]string, len(m.EtcdHosts))
	for i, h := range m.EtcdHosts {
		hosts[i] = q(h)
	}
	data := filepath.Join(m.Dir, "data")
	return fmt.Appendf(nil, `scope: %s
namespace: %s
name: %s
log:
  level: INFO
restapi:
  listen: %s
  connect_address: %s
etcd3:
  hosts: [%s]
  protocol: http
  use_proxies: true
bootstrap:
  dcs:
    ttl: %d
    loop_wait: %d
    retry_timeout: %d
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: true
    synchronous_node_count: 1
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
  initdb:
    - encoding: UTF8
    - no-locale
    - auth-local: trust
  pg_hba:
    - local all all trust
    - host replication %s 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
postgresql:
  listen: %s
  connect_address: %s
  data_dir: %s
  bin_dir: %s
  pgpass: %s
  use_unix_socket: true
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: %s
      password: %s
    replication:
      username: %s
      password: %s
  parameters:
    unix_socket_directories: %s
    password_encryption: scram-sha-256
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
`,
		q(m.Scope), q(m.Namespace), q(m.Name),
		q("127.0.0.1:"+strconv.Itoa(m.APIPort)), q(m.APIAdvertise),
		strings.Join(hosts, ", "),
		m.TTL, m.LoopWait, m.RetryTimeout,
		replicator,
		q("127.0.0.1:"+strconv.Itoa(m.Port)), q(m.Advertise), q(data), q(m.BinDir), q(filepath.Join(m.Dir, "pgpass")),
		q(Superuser), q(m.Password), q(replicator), q(m.ReplPassword),
		q(m.Dir),
	)
}

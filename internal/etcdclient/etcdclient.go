// Package etcdclient holds the etcd client flags that idemd and idemctl
// share: TLS (a CA to verify the members, a client certificate for etcd's
// --client-cert-auth) and etcd's own authentication (a user whose password
// comes from a file or IDEM_ETCD_PASSWORD, never from the command line).
package etcdclient

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idemcoord/idem/internal/tlsutil"
)

// PasswordEnv is the environment variable that holds the etcd user's
// password when --etcd-password-file is not given.
const PasswordEnv = "IDEM_ETCD_PASSWORD"

// DialTimeout is the clients' connection timeout.
const DialTimeout = 5 * time.Second

// Keepalive pings on the clients' gRPC connections: a connection a
// partition left silent (no FIN, no RST: packets just go nowhere) is
// declared dead once a ping has gone unanswered for KeepAliveTimeout, and
// the client dials again, instead of waiting for TCP to give up (minutes).
// gRPC pings no more often than every MinKeepAlive (it raises a shorter
// setting silently), so that is the default and the floor; pings go only
// while the connection carries a stream (a node always has its lease
// keepalive and its placement watch open), which is what a member permits.
// What needs a dead connection found sooner finds it itself: a node's
// placement watch asks for progress every second (routing.Map), and lease
// keepalives are bounded requests.
const (
	MinKeepAlive     = 10 * time.Second
	DefaultKeepAlive = MinKeepAlive
	// KeepAliveTimeout is how long a ping's answer is awaited (a shorter
	// wait misfires on a loaded machine, taking a live connection down).
	KeepAliveTimeout = 5 * time.Second
)

// Flags are the etcd client's TLS and authentication settings.
type Flags struct {
	// CA is a PEM file of the CAs that sign the members' certificates.
	CA string
	// Cert and Key are the client certificate presented to members that
	// run with --client-cert-auth.
	Cert, Key string
	// Username is the etcd user; its password comes from PasswordFile or
	// the PasswordEnv variable.
	Username     string
	PasswordFile string
	// KeepAlive is the interval of keepalive pings (default
	// DefaultKeepAlive).
	KeepAlive time.Duration
}

// Register adds --etcd-ca, --etcd-cert, --etcd-key, --etcd-username and
// --etcd-password-file to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.CA, "etcd-ca", "", "PEM file of the CA that signs the etcd members' certificates (endpoints then use https://)")
	fs.StringVar(&f.Cert, "etcd-cert", "", "client certificate (PEM) presented to etcd (for its --client-cert-auth); reloaded when it changes")
	fs.StringVar(&f.Key, "etcd-key", "", "private key (PEM) of --etcd-cert")
	fs.StringVar(&f.Username, "etcd-username", "", "etcd user (etcd auth enabled); the password comes from --etcd-password-file or "+PasswordEnv)
	fs.StringVar(&f.PasswordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
	fs.DurationVar(&f.KeepAlive, "etcd-keepalive", DefaultKeepAlive, "interval of keepalive pings on etcd connections (at least 10s, gRPC's floor): one whose ping goes unanswered for 5s is dropped and dialled again")
}

// Config returns a client configuration for endpoints with f's TLS and
// authentication; getenv reads PasswordEnv.
func (f *Flags) Config(endpoints []string, getenv func(string) string) (clientv3.Config, error) {
	cfg := clientv3.Config{
		Endpoints: endpoints, DialTimeout: DialTimeout, Logger: zap.NewNop(),
		DialKeepAliveTime: DefaultKeepAlive, DialKeepAliveTimeout: KeepAliveTimeout,
	}
	switch {
	case f.KeepAlive > 0 && f.KeepAlive < MinKeepAlive:
		return cfg, fmt.Errorf("--etcd-keepalive %v: gRPC pings at most every %v", f.KeepAlive, MinKeepAlive)
	case f.KeepAlive > 0:
		cfg.DialKeepAliveTime = f.KeepAlive
	}
	if (f.Cert == "") != (f.Key == "") {
		return cfg, errors.New("--etcd-cert and --etcd-key go together")
	}
	if f.CA != "" || f.Cert != "" {
		var roots *tlsutil.Pool
		var cert *tlsutil.Reloader
		var err error
		if f.CA != "" {
			if roots, err = tlsutil.NewPool(f.CA); err != nil {
				return cfg, fmt.Errorf("--etcd-ca: %w", err)
			}
		}
		if f.Cert != "" {
			if cert, err = tlsutil.NewReloader(f.Cert, f.Key); err != nil {
				return cfg, fmt.Errorf("--etcd-cert: %w", err)
			}
		}
		cfg.TLS = tlsutil.ClientConfig(roots, cert)
	}
	password := ""
	if f.PasswordFile != "" {
		b, err := os.ReadFile(f.PasswordFile)
		if err != nil {
			return cfg, fmt.Errorf("--etcd-password-file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	} else {
		password = getenv(PasswordEnv)
	}
	switch {
	case f.Username == "" && password != "":
		return cfg, fmt.Errorf("an etcd password (--etcd-password-file or %s) needs --etcd-username", PasswordEnv)
	case f.Username != "" && password == "":
		return cfg, fmt.Errorf("--etcd-username needs a password: --etcd-password-file or %s", PasswordEnv)
	}
	cfg.Username, cfg.Password = f.Username, password
	return cfg, nil
}

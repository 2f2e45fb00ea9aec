package pgserver

import (
	"fmt"
	"net"
	"path/filepath"
	"syscall"

	"github.com/idemcoord/idem/internal/tlsutil"
)

// writeTLS makes a throwaway certificate authority and a server
// certificate it signs, for 127.0.0.1, ::1 and localhost, in dir: ca.pem
// (for clients' sslrootcert), server.pem and server-key.pem. Every file is
// owned by the server's OS user; the key's mode is 0600, as PostgreSQL
// requires. New ones are made at every start.
func writeTLS(dir string, cred *syscall.Credential) error {
	ca, err := tlsutil.NewCA(dir, "pgserver throwaway CA")
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	cert, key, err := ca.Issue(dir, tlsutil.Leaf{Name: "server", DNSNames: []string{"localhost"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}})
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	for _, path := range []string{dir, ca.CertFile, filepath.Join(dir, "ca-key.pem"), cert, key} {
		if err := chown(path, cred); err != nil {
			return err
		}
	}
	return nil
}

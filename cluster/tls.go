package cluster

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"

	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/routing"
)

// PeerSecretFile is the name of the file, in the state directory, that
// holds the nodes' shared peer secret of a cluster without TLS.
const PeerSecretFile = "peer-secret"

// TLSDir is the directory, in the state directory, that holds the CA and
// the certificates of a cluster with Config.TLS.
const TLSDir = "tls"

// clusterTLS is the throwaway PKI of a cluster with Config.TLS.
type clusterTLS struct {
	dir string
	ca  *tlsutil.CA
	// client trusts the CA and presents the cluster's own client
	// certificate (etcd requires one).
	client *tls.Config
}

// loopbackIPs are the addresses every certificate is valid for.
var loopbackIPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}

// newClusterTLS makes a new CA in <state>/tls (whatever was there is
// removed) and the cluster's own client certificate.
func newClusterTLS(stateDir string) (*clusterTLS, error) {
	dir := filepath.Join(stateDir, TLSDir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("cluster: remove old certificates: %w", err)
	}
	ca, err := tlsutil.NewCA(dir, "idem local cluster CA")
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	t := &clusterTLS{dir: dir, ca: ca}
	cert, key, err := t.issue("cluster", nil)
	if err != nil {
		return nil, err
	}
	roots, err := tlsutil.NewPool(ca.CertFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	rel, err := tlsutil.NewReloader(cert, key)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	t.client = tlsutil.ClientConfig(roots, rel)
	return t, nil
}

// issue makes the certificate of name, valid for the loopback addresses
// and localhost, naming peer when it is a node.
func (t *clusterTLS) issue(name string, peer *routing.Peer) (cert, key string, err error) {
	leaf := tlsutil.Leaf{Name: name, IPs: loopbackIPs, DNSNames: []string{"localhost"}}
	if peer != nil {
		leaf.URIs = []*url.URL{peer.URI()}
		leaf.DNSNames = append(leaf.DNSNames, peer.DNSName())
	}
	cert, key, err = t.ca.Issue(t.dir, leaf)
	if err != nil {
		return "", "", fmt.Errorf("cluster: %w", err)
	}
	return cert, key, nil
}

// writePeerSecret writes a new random peer secret to <state>/peer-secret
// (0600) and returns its path.
func writePeerSecret(stateDir string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("cluster: peer secret: %w", err)
	}
	path := filepath.Join(stateDir, PeerSecretFile)
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(b[:])+"\n")); err != nil {
		return "", err
	}
	return path, nil
}

// scheme is the URL scheme of the cluster's HTTP endpoints.
func (c *Cluster) scheme() string {
	if c.tls != nil {
		return "https"
	}
	return "http"
}

// ClientTLS returns a client configuration that trusts the cluster's CA and
// presents the cluster's client certificate (which etcd requires), or nil
// for a cluster without Config.TLS. The caller may modify it.
func (c *Cluster) ClientTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.client.Clone()
}

// CAFile returns the path of the CA certificate of a cluster with
// Config.TLS ("" without).
func (c *Cluster) CAFile() string {
	if c.tls == nil {
		return ""
	}
	return c.tls.ca.CertFile
}

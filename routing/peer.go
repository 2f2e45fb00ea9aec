package routing

import (
	"crypto/x509"
	"net/url"
	"strings"
)

// PeerScheme and PeerTrustDomain make up a node's identity in its
// certificate: the URI SAN spiffe://idem/region/<region>/node/<node>.
const (
	PeerScheme      = "spiffe"
	PeerTrustDomain = "idem"
)

// Peer names a node of the cluster: its region and node id, as registered
// under /idem/regions/<region>/nodes/<node>.
type Peer struct {
	Region string
	Node   string
}

// String returns "<region>/<node>".
func (p Peer) String() string { return p.Region + "/" + p.Node }

// URI returns the node's identity as a certificate URI SAN:
// spiffe://idem/region/<region>/node/<node>.
func (p Peer) URI() *url.URL {
	return &url.URL{Scheme: PeerScheme, Host: PeerTrustDomain,
		Path: "/region/" + p.Region + "/node/" + p.Node}
}

// DNSName returns the node's identity as a certificate DNS name,
// <node>.<region>.idem, for tools that only look at DNS names.
func (p Peer) DNSName() string { return p.Node + "." + p.Region + "." + PeerTrustDomain }

// ParsePeerURI reads a peer identity URI made by Peer.URI.
func ParsePeerURI(u *url.URL) (Peer, bool) {
	if u == nil || u.Scheme != PeerScheme || u.Host != PeerTrustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Peer{}, false
	}
	parts := strings.Split(u.Path, "/")
	if len(parts) != 5 || parts[0] != "" || parts[1] != "region" || parts[3] != "node" || !validName(parts[2]) || !validName(parts[4]) {
		return Peer{}, false
	}
	return Peer{Region: parts[2], Node: parts[4]}, true
}

// PeerOf returns the identity of a certificate: its only peer URI SAN. A
// certificate with none, or with several, names no peer.
func PeerOf(cert *x509.Certificate) (Peer, bool) {
	var found []Peer
	for _, u := range cert.URIs {
		if p, ok := ParsePeerURI(u); ok {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return Peer{}, false
	}
	return found[0], true
}

// ParsePeer reads "<region>/<node>".
func ParsePeer(s string) (Peer, bool) {
	r, n, ok := strings.Cut(s, "/")
	if !ok || !validName(r) || !validName(n) {
		return Peer{}, false
	}
	return Peer{Region: r, Node: n}, true
}

// validName accepts region and node names: 1 to 128 letters, digits, '-',
// '_' and '.'.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

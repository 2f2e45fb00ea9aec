package routing_test

import (
	"crypto/x509"
	"net/url"
	"testing"

	"github.com/idemcoord/idem/routing"
)

// TestPeerIdentity: a node's URI SAN round-trips, and nothing else names a
// peer.
func TestPeerIdentity(t *testing.T) {
	p := routing.Peer{Region: "eu-west", Node: "eu-west-0"}
	if got := p.URI().String(); got != "spiffe://idem/region/eu-west/node/eu-west-0" {
		t.Errorf("URI %s", got)
	}
	if got, ok := routing.ParsePeerURI(p.URI()); !ok || got != p {
		t.Errorf("ParsePeerURI(%s) = %v, %v", p.URI(), got, ok)
	}
	for _, raw := range []string{
		"spiffe://other/region/eu-west/node/n",
		"https://idem/region/eu-west/node/n",
		"spiffe://idem/region/eu-west/node/",
		"spiffe://idem/region/eu-west/node/n/extra",
		"spiffe://idem/region//node/n",
		"spiffe://idem/region/eu%2Fwest/node/n",
		"spiffe://idem/region/eu-west/node/n?x=1",
		"spiffe://user@idem/region/eu-west/node/n",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		if got, ok := routing.ParsePeerURI(u); ok {
			t.Errorf("ParsePeerURI(%s) = %v, want no peer", raw, got)
		}
	}
	one := &x509.Certificate{URIs: []*url.URL{p.URI()}}
	if got, ok := routing.PeerOf(one); !ok || got != p {
		t.Errorf("PeerOf = %v, %v", got, ok)
	}
	two := &x509.Certificate{URIs: []*url.URL{p.URI(), routing.Peer{Region: "us-east", Node: "x"}.URI()}}
	if _, ok := routing.PeerOf(two); ok {
		t.Error("a certificate naming two nodes names a peer")
	}
	if _, ok := routing.PeerOf(&x509.Certificate{}); ok {
		t.Error("a certificate naming no node names a peer")
	}
}

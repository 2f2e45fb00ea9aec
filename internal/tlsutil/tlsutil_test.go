package tlsutil_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemcoord/idem/internal/tlsutil"
)

// served returns the common name of the certificate a TLS server at addr
// presents, verified against roots.
func served(t *testing.T, addr string, roots *tlsutil.Pool) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, tlsutil.ClientConfig(roots, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestReloaderServesReplacedFiles: replacing the certificate and key files
// changes the certificate a running server presents, without a restart.
func TestReloaderServesReplacedFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf := tlsutil.Leaf{Name: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	certFile, keyFile, err := ca.Issue(dir, leaf)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := tlsutil.NewReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsutil.ServerConfig(rel, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	roots, err := tlsutil.NewPool(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := served(t, ln.Addr().String(), roots); got != "server" {
		t.Fatalf("served %q, want server", got)
	}

	// A new certificate under another name, moved over the old files.
	other := t.TempDir()
	newCert, newKey, err := ca.Issue(other, tlsutil.Leaf{Name: "renewed", IPs: leaf.IPs})
	if err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{newKey: keyFile, newCert: certFile} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	if got := served(t, ln.Addr().String(), roots); got != "renewed" {
		t.Fatalf("after replacing the files, served %q, want renewed", got)
	}
}

// TestKeysArePrivate: key files are written 0600.
func TestKeysArePrivate(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	_, keyFile, err := ca.Issue(dir, tlsutil.Leaf{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{keyFile, filepath.Join(dir, "ca-key.pem")} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
}

// TestPoolRejectsOtherCA: a certificate from another CA does not verify.
func TestPoolRejectsOtherCA(t *testing.T) {
	dir := t.TempDir()
	ca, _ := tlsutil.NewCA(filepath.Join(dir, "a"), "a")
	evil, _ := tlsutil.NewCA(filepath.Join(dir, "b"), "b")
	cert, _, err := evil.Issue(dir, tlsutil.Leaf{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsutil.NewPool(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := tlsutil.NewReloader(cert, filepath.Join(dir, "x-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := rel.Certificate()
	if _, err := pool.Verify(c.Certificate, x509.ExtKeyUsageClientAuth); err == nil {
		t.Error("a certificate of another CA verified")
	}
}

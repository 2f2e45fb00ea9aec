package pgserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// tlsValidity is how long the throwaway certificates are valid.
const tlsValidity = 30 * 24 * time.Hour

// writeTLS makes a throwaway certificate authority and a server
// certificate it signs, for 127.0.0.1, ::1 and localhost, in dir: ca.crt
// (for clients' sslrootcert), server.crt and server.key. The key is owned
// by the server's OS user with mode 0600, as PostgreSQL requires. New ones
// are made at every start.
func writeTLS(dir string, cred *syscall.Credential) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	if err := chown(dir, cred); err != nil {
		return err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "pgserver throwaway CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(tlsValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	srv := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(tlsValidity),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return fmt.Errorf("pgserver: tls: %w", err)
	}
	files := []struct {
		name, typ string
		der       []byte
		mode      os.FileMode
	}{
		{"ca.crt", "CERTIFICATE", caDER, 0o644},
		{"server.crt", "CERTIFICATE", srvDER, 0o644},
		{"server.key", "PRIVATE KEY", keyDER, 0o600},
	}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		_ = os.Remove(path) // a key of an earlier start may be read-only
		b := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(path, b, f.mode); err != nil {
			return fmt.Errorf("pgserver: tls: %w", err)
		}
		if err := chown(path, cred); err != nil {
			return err
		}
	}
	return nil
}

// serial returns a random certificate serial number.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)) // never fails on crypto/rand
	return n
}

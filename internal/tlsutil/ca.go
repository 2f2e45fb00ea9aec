package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Validity is how long the certificates made here are valid: long enough
// for a development cluster or a test run, short enough that a leaked one
// soon stops working.
const Validity = 7 * 24 * time.Hour

// CA is a certificate authority whose key is held in memory.
type CA struct {
	// CertFile is the PEM file of the CA certificate, which verifiers trust.
	CertFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a new CA named name and writes its certificate to
// dir/ca.pem (0644) and its key to dir/ca-key.pem (0600). dir is created
// (0700) if missing.
func NewCA(dir, name string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("tlsutil: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsutil: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tlsutil: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsutil: CA certificate: %w", err)
	}
	ca := &CA{CertFile: filepath.Join(dir, "ca.pem"), cert: cert, key: key}
	if err := writePEM(ca.CertFile, 0o644, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "ca-key.pem"), key); err != nil {
		return nil, err
	}
	return ca, nil
}

// Leaf names what a leaf certificate is valid for. Every leaf may serve
// (server auth) and present itself as a client (client auth).
type Leaf struct {
	// Name is its common name, and the base of its file names.
	Name     string
	DNSNames []string
	IPs      []net.IP
	URIs     []*url.URL
}

// Issue makes a leaf certificate and writes it to dir/<name>.pem (0644)
// and its key to dir/<name>-key.pem (0600). It returns the two paths.
func (ca *CA) Issue(dir string, leaf Leaf) (certFile, keyFile string, err error) {
	if leaf.Name == "" {
		return "", "", errors.New("tlsutil: a leaf needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("tlsutil: key of %s: %w", leaf.Name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: leaf.Name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     leaf.DNSNames,
		IPAddresses:  leaf.IPs,
		URIs:         leaf.URIs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("tlsutil: certificate of %s: %w", leaf.Name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("tlsutil: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, leaf.Name+".pem"), filepath.Join(dir, leaf.Name+"-key.pem")
	if err := writeKey(keyFile, key); err != nil {
		return "", "", err
	}
	if err := writePEM(certFile, 0o644, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("tlsutil: random serial: %v", err)) // crypto/rand never fails on Linux
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("tlsutil: marshal key: %w", err)
	}
	return writePEM(path, 0o600, "PRIVATE KEY", der)
}

// writePEM writes one PEM block to path atomically (a temporary file in
// the same directory, renamed over path) with mode perm, so that a reader
// never sees a half-written file.
func writePEM(path string, perm os.FileMode, typ string, der []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("tlsutil: write %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		err = pem.Encode(f, &pem.Block{Type: typ, Bytes: der})
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("tlsutil: write %s: %w", path, err)
	}
	return nil
}

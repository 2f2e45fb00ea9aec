package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// fileStamp identifies a version of a file.
type fileStamp struct {
	info os.FileInfo
}

func (s fileStamp) same(fi os.FileInfo) bool {
	return s.info != nil && os.SameFile(s.info, fi) && s.info.ModTime().Equal(fi.ModTime()) && s.info.Size() == fi.Size()
}

// changed reports whether any of paths differs from its stamp, and returns
// the new stamps.
func changed(paths []string, stamps []fileStamp) (bool, []fileStamp, error) {
	now := make([]fileStamp, len(paths))
	diff := false
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return false, nil, fmt.Errorf("tlsutil: %w", err)
		}
		now[i] = fileStamp{fi}
		if i >= len(stamps) || !stamps[i].same(fi) {
			diff = true
		}
	}
	return diff, now, nil
}

// Reloader serves a certificate and key pair from files, reloading them
// when they change. Its methods are safe for concurrent use.
type Reloader struct {
	certFile, keyFile string

	mu     sync.Mutex
	stamps []fileStamp
	cert   *tls.Certificate
}

// NewReloader loads certFile and keyFile (PEM) and returns a Reloader over
// them. It fails if they do not hold a matching pair.
func NewReloader(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.Certificate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Certificate returns the current pair, reloading it first if either file
// changed. A pair that does not load (a file replaced but not the other
// yet) leaves the previous one in place; the error is returned only when
// there is none.
func (r *Reloader) Certificate() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	diff, stamps, err := changed([]string{r.certFile, r.keyFile}, r.stamps)
	if err != nil || !diff {
		if r.cert == nil {
			return nil, err
		}
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		if r.cert == nil {
			return nil, fmt.Errorf("tlsutil: %w", err)
		}
		return r.cert, nil
	}
	r.cert, r.stamps = &cert, stamps
	return r.cert, nil
}

// GetCertificate is a tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.Certificate()
}

// GetClientCertificate is a tls.Config.GetClientCertificate.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.Certificate()
}

// Pool is a set of trusted CA certificates read from a PEM file and
// reloaded when it changes. Its methods are safe for concurrent use.
type Pool struct {
	file string

	mu     sync.Mutex
	stamps []fileStamp
	pool   *x509.CertPool
}

// NewPool loads the CA certificates of file.
func NewPool(file string) (*Pool, error) {
	p := &Pool{file: file}
	if _, err := p.Get(); err != nil {
		return nil, err
	}
	return p, nil
}

// Get returns the current pool, reloading the file first if it changed
// (keeping the last good pool if the new file does not parse).
func (p *Pool) Get() (*x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	diff, stamps, err := changed([]string{p.file}, p.stamps)
	if err != nil || !diff {
		if p.pool == nil {
			return nil, err
		}
		return p.pool, nil
	}
	b, err := os.ReadFile(p.file)
	if err != nil {
		if p.pool == nil {
			return nil, fmt.Errorf("tlsutil: %w", err)
		}
		return p.pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		if p.pool == nil {
			return nil, fmt.Errorf("tlsutil: %s holds no PEM certificate", p.file)
		}
		return p.pool, nil
	}
	p.pool, p.stamps = pool, stamps
	return p.pool, nil
}

// Verify checks a certificate chain presented by the other side (leaf
// first) against the pool for usage, and returns the leaf.
func (p *Pool) Verify(rawCerts [][]byte, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	if len(rawCerts) == 0 {
		return nil, errors.New("tlsutil: no certificate presented")
	}
	pool, err := p.Get()
	if err != nil {
		return nil, err
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		if certs[i], err = x509.ParseCertificate(raw); err != nil {
			return nil, fmt.Errorf("tlsutil: parse certificate: %w", err)
		}
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: time.Now()}); err != nil {
		return nil, fmt.Errorf("tlsutil: verify certificate: %w", err)
	}
	return certs[0], nil
}

// ServerConfig returns a server configuration that serves cert and, when
// clientCAs is not nil, verifies client certificates against it if the
// client presents one (tls.VerifyClientCertIfGiven): clients that
// authenticate otherwise need none. Both are re-read as they change.
func ServerConfig(cert *Reloader, clientCAs *Pool) *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert.GetCertificate}
	if clientCAs == nil {
		return base
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := clientCAs.Get()
		if err != nil {
			return nil, err
		}
		c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert.GetCertificate,
			ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
		return c, nil
	}
	return base
}

// ClientConfig returns a client configuration that trusts roots (re-read
// as it changes; nil: the system's roots) and presents cert when the
// server asks for one (nil: none).
func ClientConfig(roots *Pool, cert *Reloader) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.GetClientCertificate = cert.GetClientCertificate
	}
	if roots != nil {
		// Verify against the current pool ourselves: RootCAs is fixed
		// once the config is in use.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			raw := make([][]byte, len(cs.PeerCertificates))
			for i, pc := range cs.PeerCertificates {
				raw[i] = pc.Raw
			}
			leaf, err := roots.Verify(raw, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if cs.ServerName == "" {
				return nil
			}
			return leaf.VerifyHostname(cs.ServerName)
		}
	}
	return c
}

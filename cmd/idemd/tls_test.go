package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/routing"
)

var loopback = []net.IP{net.IPv4(127, 0, 0, 1)}

func newCA(t *testing.T) (*tlsutil.CA, string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsutil.NewCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca, dir
}

func issue(t *testing.T, ca *tlsutil.CA, dir string, leaf tlsutil.Leaf) (cert, key string) {
	t.Helper()
	cert, key, err := ca.Issue(dir, leaf)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// tlsClient trusts ca, presents cert/key if given, and opens a new
// connection for every request.
func tlsClient(t *testing.T, ca *tlsutil.CA, cert, key string) *http.Client {
	t.Helper()
	roots, err := tlsutil.NewPool(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	var rel *tlsutil.Reloader
	if cert != "" {
		if rel, err = tlsutil.NewReloader(cert, key); err != nil {
			t.Fatal(err)
		}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsutil.ClientConfig(roots, rel), DisableKeepAlives: true}}
}

// servedName returns the common name of the certificate the node serves.
func servedName(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.TLS.PeerCertificates[0].Subject.CommonName
}

// TestServesHTTPSAndReloadsCertificate: with --tls-cert and --tls-key the
// node serves HTTPS; replacing the files changes the certificate it
// serves, without a restart.
func TestServesHTTPSAndReloadsCertificate(t *testing.T) {
	ca, dir := newCA(t)
	cert, key := issue(t, ca, dir, tlsutil.Leaf{Name: "first", IPs: loopback})
	addr := freeAddr(t)
	client := tlsClient(t, ca, "", "")
	p := &proc{t: t, url: "https://" + addr, client: client,
		args: []string{"--listen", addr, "--database-url", pgtest.NewDatabase(t), "--auth-tokens-file", tokensFile(t, "tok-a=tenant-a\n"),
			"--tls-cert", cert, "--tls-key", key}}
	p.start()
	t.Cleanup(p.stop)
	if got := servedName(t, client, p.url); got != "first" {
		t.Fatalf("serves %q, want first", got)
	}
	pid := p.cmd.Process.Pid

	newCert, newKey := issue(t, ca, t.TempDir(), tlsutil.Leaf{Name: "second", IPs: loopback})
	for from, to := range map[string]string{newKey: key, newCert: cert} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	if got := servedName(t, client, p.url); got != "second" {
		t.Errorf("after replacing the files, serves %q, want second", got)
	}
	if p.cmd.Process.Pid != pid || p.cmd.ProcessState != nil {
		t.Error("the node restarted")
	}
}

// nodeRegistered waits until node is registered in etcd (read with cli).
func nodeRegistered(t *testing.T, cli *clientv3.Client, region, node string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, routing.NodeKey(region, node))
		cancel()
		if err == nil && len(resp.Kvs) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s/%s not registered in etcd: %v", region, node, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEtcdClientCertificate: against etcd with --client-cert-auth, the
// node connects over TLS with --etcd-ca, --etcd-cert and --etcd-key and
// joins its region.
func TestEtcdClientCertificate(t *testing.T) {
	ca, dir := newCA(t)
	srvCert, srvKey := issue(t, ca, dir, tlsutil.Leaf{Name: "etcd", IPs: loopback})
	cliCert, cliKey := issue(t, ca, dir, tlsutil.Leaf{Name: "idemd"})
	etcd := etcdtest.Start(t, etcdtest.WithClientCertAuth(srvCert, srvKey, ca.CertFile))
	if !strings.HasPrefix(etcd.Endpoints[0], "https://") {
		t.Fatalf("etcd endpoint %s is not https", etcd.Endpoints[0])
	}
	roots, _ := tlsutil.NewPool(ca.CertFile)
	rel, _ := tlsutil.NewReloader(cliCert, cliKey)
	cfg := etcd.Config()
	cfg.TLS = tlsutil.ClientConfig(roots, rel)
	cli := etcdtest.NewClient(t, cfg)

	startIdemd(t, pgtest.NewDatabase(t), "--region", "eu-west", "--node-id", "eu-west-0",
		"--etcd-endpoints", strings.Join(etcd.Endpoints, ","),
		"--etcd-ca", ca.CertFile, "--etcd-cert", cliCert, "--etcd-key", cliKey, "--peer-secret-file", peerSecretFile)
	nodeRegistered(t, cli, "eu-west", "eu-west-0")
}

// TestEtcdUserPassword: with etcd's authentication enabled, the node logs
// in as --etcd-username, its password read from --etcd-password-file or
// IDEM_ETCD_PASSWORD (never from the command line).
func TestEtcdUserPassword(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	admin := etcd.Client(t)
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "idem"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "idem", "/idem/", clientv3.GetPrefixRangeEnd("/idem/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "idem", "idem-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "idem", "idem"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := etcd.Config()
	cfg.Username, cfg.Password = "root", "root-pw"
	root := etcdtest.NewClient(t, cfg)

	pwFile := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(pwFile, []byte("idem-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(etcd.Endpoints, ",")
	common := []string{"--region", "eu-west", "--etcd-endpoints", ep, "--etcd-username", "idem", "--peer-secret-file", peerSecretFile}
	startIdemd(t, pgtest.NewDatabase(t), append(common, "--node-id", "from-file", "--etcd-password-file", pwFile)...)
	startIdemdEnv(t, []string{"IDEM_ETCD_PASSWORD=idem-pw"}, pgtest.NewDatabase(t), append(common, "--node-id", "from-env")...)
	nodeRegistered(t, root, "eu-west", "from-file")
	nodeRegistered(t, root, "eu-west", "from-env")
}

// TestWarnsWithoutPeerCredentials: a node in a multi-region deployment with
// neither mTLS nor a peer secret says at startup that it refuses forwarded
// requests.
func TestWarnsWithoutPeerCredentials(t *testing.T) {
	etcd := etcdtest.Start(t)
	p := startIdemd(t, pgtest.NewDatabase(t), "--region", "eu-west", "--node-id", "lonely",
		"--etcd-endpoints", strings.Join(etcd.Endpoints, ","))
	if !strings.Contains(p.log.String(), "refuses requests forwarded by other nodes") {
		t.Errorf("no startup warning about peer authentication:\n%s", p.log)
	}
}

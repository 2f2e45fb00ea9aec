package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idemcoord/idem/internal/etcdtest"
	"github.com/idemcoord/idem/internal/tlsutil"
)

// idemctlRun runs idemctl with args and environment vars (name -> value)
// and returns its exit code and output.
func idemctlRun(t *testing.T, vars map[string]string, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &out, Getenv: func(k string) string { return vars[k] }}
	code := Run(context.Background(), args, env)
	return code, out.String()
}

// TestEtcdCommandsOverTLS: placement and region commands reach an etcd
// that requires client certificates with --etcd-ca, --etcd-cert and
// --etcd-key.
func TestEtcdCommandsOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.Issue(dir, tlsutil.Leaf{Name: "etcd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := ca.Issue(dir, tlsutil.Leaf{Name: "idemctl"})
	if err != nil {
		t.Fatal(err)
	}
	etcd := etcdtest.Start(t, etcdtest.WithClientCertAuth(srvCert, srvKey, ca.CertFile))
	flags := []string{"--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--etcd-ca", ca.CertFile, "--etcd-cert", cliCert, "--etcd-key", cliKey}
	if code, out := idemctlRun(t, nil, append([]string{"placement", "set", "--tenant", "t1", "--region", "eu-west"}, flags...)...); code != 0 {
		t.Fatalf("placement set: exit %d\n%s", code, out)
	}
	code, out := idemctlRun(t, nil, append([]string{"placement", "get", "--tenant", "t1"}, flags...)...)
	if code != 0 || !strings.Contains(out, "eu-west") {
		t.Fatalf("placement get: exit %d\n%s", code, out)
	}
	if code, out := idemctlRun(t, nil, append([]string{"region", "status"}, flags...)...); code != 0 || !strings.Contains(out, "eu-west") {
		t.Fatalf("region status: exit %d\n%s", code, out)
	}
}

// TestEtcdCommandsWithAuth: with etcd's authentication enabled, the
// commands log in as --etcd-username with the password of
// --etcd-password-file or IDEM_ETCD_PASSWORD.
func TestEtcdCommandsWithAuth(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	admin := etcd.Client(t)
	if _, err := admin.UserAdd(ctx, "root", "root-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RoleAdd(ctx, "operator"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RoleGrantPermission(ctx, "operator", "/idem/", clientv3.GetPrefixRangeEnd("/idem/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserAdd(ctx, "ops", "ops-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "ops", "operator"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(etcd.Endpoints, ",")
	if code, _ := idemctlRun(t, nil, "placement", "set", "--tenant", "t1", "--region", "eu-west", "--etcd-endpoints", ep); code == 0 {
		t.Error("placement set without credentials succeeded")
	}
	if code, out := idemctlRun(t, map[string]string{"IDEM_ETCD_PASSWORD": "ops-pw"},
		"placement", "set", "--tenant", "t1", "--region", "eu-west", "--etcd-endpoints", ep, "--etcd-username", "ops"); code != 0 {
		t.Fatalf("placement set with IDEM_ETCD_PASSWORD: exit %d\n%s", code, out)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("ops-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := idemctlRun(t, nil, "placement", "get", "--tenant", "t1", "--etcd-endpoints", ep, "--etcd-username", "ops", "--etcd-password-file", pw)
	if code != 0 || !strings.Contains(out, "eu-west") {
		t.Fatalf("placement get with --etcd-password-file: exit %d\n%s", code, out)
	}
	if code, _ := idemctlRun(t, nil, "placement", "get", "--tenant", "t1", "--etcd-endpoints", ep, "--etcd-username", "ops"); code != 2 {
		t.Errorf("--etcd-username without a password: exit %d, want 2", code)
	}
}

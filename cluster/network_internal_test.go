package cluster

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestSocketOwner finds the process holding the other end of an accepted
// loopback connection: this one.
func TestSocketOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	local := netip.MustParseAddrPort(server.LocalAddr().String())
	remote := netip.MustParseAddrPort(server.RemoteAddr().String())

	pid, err := socketOwner(remote, local, []int{1, os.Getpid()})
	if err != nil || pid != os.Getpid() {
		t.Errorf("socketOwner = %d, %v; want this process, %d", pid, err, os.Getpid())
	}
	if pid, err := socketOwner(remote, local, []int{1}); err == nil {
		t.Errorf("socketOwner among other processes = %d, want an error", pid)
	}

	if ok, err := listensOn(os.Getpid(), ln.Addr().String()); !ok || err != nil {
		t.Errorf("listensOn(this process, %s) = %v, %v; want true", ln.Addr(), ok, err)
	}
	if ok, err := listensOn(1, ln.Addr().String()); ok || err != nil {
		t.Errorf("listensOn(1, %s) = %v, %v; want false", ln.Addr(), ok, err)
	}
	if ok, err := listensOn(os.Getpid(), client.LocalAddr().String()); ok || !errors.Is(err, errNoSocket) {
		t.Errorf("listensOn(a port nobody listens on) = %v, %v; want errNoSocket", ok, err)
	}
}

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"0000000000000000FFFF00000100007F:0050": "127.0.0.1:80",
		"00000000000000000000000001000000:01BB": "[::1]:443",
	} {
		got, ok := parseProcAddr(in)
		if !ok || got.String() != want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:XYZ", "01007F:0050"} {
		if _, ok := parseProcAddr(bad); ok {
			t.Errorf("parseProcAddr(%q) succeeded", bad)
		}
	}
	inode, ok := scanTCP(strings.NewReader(
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"+
			"   0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1\n"),
		netip.MustParseAddrPort("127.0.0.1:8080"), netip.MustParseAddrPort("127.0.0.1:50000"), "")
	if !ok || inode != "4242" {
		t.Errorf("scanTCP = %q, %v; want 4242", inode, ok)
	}
}

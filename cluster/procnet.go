package cluster

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Which process holds a TCP socket, from Linux's /proc: the peer
// demultiplexers use it to tell the etcd members' connections apart, and
// WaitReady to make sure the process answering on a port is the child it
// started, not another process that took the port first.

var (
	// errNoSocket: no process among those searched holds the socket.
	errNoSocket = errors.New("socket not found")
	// errOrphan: the socket is held by no process any more (its owner
	// closed it; the kernel is finishing the connection).
	errOrphan = errors.New("socket closed by its owner")
)

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// socketOwner returns which of pids holds the TCP socket whose local
// address is local and whose peer is remote: the other end of a loopback
// connection this process accepted.
func socketOwner(local, remote netip.AddrPort, pids []int) (int, error) {
	inode, err := tcpInode(local, remote, "")
	if err != nil {
		return 0, err
	}
	if inode == "0" {
		return 0, fmt.Errorf("%w: %s -> %s", errOrphan, local, remote)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		if holds(pid, inode) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("%w: no process among %v holds socket:[%s] (%s -> %s)", errNoSocket, pids, inode, local, remote)
}

// listensOn reports whether process pid holds the socket listening on addr
// (127.0.0.1:PORT). It returns an error wrapping errNoSocket if nothing
// listens there, and other errors if /proc cannot be read.
func listensOn(pid int, addr string) (bool, error) {
	local, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false, err
	}
	inode, err := tcpInode(local, netip.AddrPortFrom(netip.IPv4Unspecified(), 0), tcpListen)
	if err != nil {
		return false, err
	}
	return holds(pid, inode), nil
}

// holds reports whether process pid has a descriptor of socket inode.
func holds(pid int, inode string) bool {
	want := "socket:[" + inode + "]"
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if l, err := os.Readlink(dir + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}

// tcpInode finds the inode of the TCP socket local -> remote (in state
// state, if not "") in /proc/net/tcp or /proc/net/tcp6.
func tcpInode(local, remote netip.AddrPort, state string) (string, error) {
	read := false
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		read = true
		inode, ok := scanTCP(f, local, remote, state)
		_ = f.Close()
		if ok {
			return inode, nil
		}
	}
	if !read {
		return "", errors.New("cannot read /proc/net/tcp")
	}
	return "", fmt.Errorf("%w: no TCP socket %s -> %s in /proc/net", errNoSocket, local, remote)
}

// scanTCP scans a /proc/net/tcp table for the socket local -> remote (in
// state state, if not "").
func scanTCP(r io.Reader, local, remote netip.AddrPort, state string) (string, bool) {
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || (state != "" && f[3] != state) {
			continue
		}
		l, ok1 := parseProcAddr(f[1])
		r, ok2 := parseProcAddr(f[2])
		if ok1 && ok2 && l == local && (r == remote || (r.Port() == 0 && remote.Port() == 0 && r.Addr().IsUnspecified())) {
			return f[9], true
		}
	}
	return "", false
}

// parseProcAddr parses an address of /proc/net/tcp{,6}: the address as
// 32-bit words in host byte order, in hex, then ":" and the port in hex.
// IPv4-mapped IPv6 addresses are returned as IPv4.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// Package freeport picks ports of 127.0.0.1 for the real servers the tests
// and the local cluster start (etcd members, Patroni and its PostgreSQL).
package freeport

import (
	"fmt"
	"net"
)

// Distinct returns n distinct ports the kernel had free a moment ago. All
// n are held open until every one is picked, so that the kernel cannot
// hand one out twice (a port picked and closed at once may be the next
// pick too); a server that starts later may still find one taken.
func Distinct(n int) ([]int, error) {
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: pick a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

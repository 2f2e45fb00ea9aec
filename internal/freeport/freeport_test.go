package freeport_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/idemcoord/idem/internal/freeport"
)

// TestDistinct: the ports picked together are distinct and free once
// returned.
func TestDistinct(t *testing.T) {
	ports, err := freeport.Distinct(16)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 16 {
		t.Fatalf("%d ports, want 16", len(ports))
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d picked twice in %v", p, ports)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free once returned: %v", p, err)
		}
		_ = ln.Close()
	}
}

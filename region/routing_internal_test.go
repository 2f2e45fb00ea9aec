package region

import (
	"fmt"
	"testing"
)

// FuzzParseForwardedBy: whatever is accepted is exactly what a node
// writes, with a hop count from 1 to maxHops.
func FuzzParseForwardedBy(f *testing.F) {
	for _, s := range []string{"eu-west/eu-west-0; hops=1", "x; hops=-7", "a/b; hops=01", "a/b; hops=+1", "a/b;hops=1", "a/b; hops=2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		peer, hops, ok := parseForwardedBy(s)
		if !ok {
			return
		}
		if hops < 1 || hops > maxHops {
			t.Fatalf("%q: accepted hops=%d", s, hops)
		}
		if again := fmt.Sprintf("%s/%s; hops=%d", peer.Region, peer.Node, hops); again != s {
			t.Fatalf("%q accepted, but a node would write %q", s, again)
		}
	})
}

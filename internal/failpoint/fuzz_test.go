package failpoint

import (
	"context"
	"strings"
	"testing"
)

// FuzzParse checks failpoint specifications: Parse never panics, accepted
// points have names without surrounding space and sane counts, parsing is
// deterministic, and evaluating any accepted point under a cancelled context
// returns (whatever its sleep).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "a=sleep(30ms)", "a=sleep(1s); b=1*sleep(5s)", "a=0*sleep(1s)", "a=sleep(-1s)", "=sleep(1s)", "a=sleep(1s",
		"a=2*sleep(1h);a=sleep(1ms)", "a=x*sleep(1s)", "a=sleep(9999999999999h)", " ; ;", "a =sleep(1s)",
	} {
		f.Add(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := Parse(spec)
		s2, err2 := Parse(spec)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("Parse(%q) is not deterministic", spec)
		}
		if err != nil {
			if s != nil {
				t.Fatalf("Parse(%q) returned a set with error %v", spec, err)
			}
			return
		}
		if len(s.points) != len(s2.points) {
			t.Fatalf("Parse(%q) is not deterministic", spec)
		}
		for name, p := range s.points {
			if name == "" || strings.TrimSpace(name) != name || strings.Contains(name, ";") {
				t.Fatalf("Parse(%q) accepted point name %q", spec, name)
			}
			if p.left == 0 || p.left < -1 {
				t.Fatalf("Parse(%q) gave %q a count of %d", spec, name, p.left)
			}
			s.Eval(ctx, name)
		}
	})
}

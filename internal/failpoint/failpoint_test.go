package failpoint

import (
	"context"
	"testing"
	"time"
)

func TestParseAndEval(t *testing.T) {
	s, err := Parse("a=sleep(30ms); b=1*sleep(30ms)")
	if err != nil {
		t.Fatal(err)
	}
	measure := func(name string) time.Duration {
		start := time.Now()
		s.Eval(context.Background(), name)
		return time.Since(start)
	}
	if d := measure("a"); d < 30*time.Millisecond {
		t.Errorf("a slept %v, want >= 30ms", d)
	}
	if d := measure("b"); d < 30*time.Millisecond {
		t.Errorf("b slept %v the first time, want >= 30ms", d)
	}
	if d := measure("b"); d >= 30*time.Millisecond {
		t.Errorf("b fired a second time (%v) with count 1", d)
	}
	if d := measure("c"); d >= 30*time.Millisecond {
		t.Errorf("inactive point slept %v", d)
	}
	var none *Set
	none.Eval(context.Background(), "a")
	for _, bad := range []string{"x", "x=panic", "x=sleep(1)", "x=0*sleep(1s)", "=sleep(1s)"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestEvalStopsWithContext(t *testing.T) {
	s, _ := Parse("x=sleep(1h)")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { s.Eval(ctx, "x"); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Eval ignored its context")
	}
}

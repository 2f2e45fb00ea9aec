package etcdclient

import (
	"strings"
	"testing"
	"time"
)

// TestKeepAliveFloor: gRPC pings at most every 10s (it raises a shorter
// interval silently), so a shorter --etcd-keepalive is refused rather than
// promised; the default and a longer setting are used as given, with the
// ping's answer awaited KeepAliveTimeout.
func TestKeepAliveFloor(t *testing.T) {
	none := func(string) string { return "" }
	if _, err := (&Flags{KeepAlive: 2 * time.Second}).Config([]string{"http://127.0.0.1:2379"}, none); err == nil || !strings.Contains(err.Error(), "10s") {
		t.Errorf("--etcd-keepalive 2s: %v, want a refusal naming gRPC's 10s floor", err)
	}
	for _, c := range []struct{ flag, want time.Duration }{{0, DefaultKeepAlive}, {MinKeepAlive, MinKeepAlive}, {30 * time.Second, 30 * time.Second}} {
		cfg, err := (&Flags{KeepAlive: c.flag}).Config([]string{"http://127.0.0.1:2379"}, none)
		if err != nil {
			t.Fatalf("--etcd-keepalive %v: %v", c.flag, err)
		}
		if cfg.DialKeepAliveTime != c.want || cfg.DialKeepAliveTimeout != KeepAliveTimeout {
			t.Errorf("--etcd-keepalive %v: time %v timeout %v, want %v and %v", c.flag, cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout, c.want, KeepAliveTimeout)
		}
	}
}

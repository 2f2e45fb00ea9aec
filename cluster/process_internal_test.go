package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWaitReadyForeignListener: a port taken by another process that
// answers the readiness probe does not make the child ready; the child,
// which cannot bind the port, fails with errAddrInUse (so that firstStart
// moves it to another port).
func TestWaitReadyForeignListener(t *testing.T) {
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer foreign.Close()
	p := &Process{
		kind: KindNode,
		name: "test-0",
		path: "/bin/sh",
		argv: func(addr string) []string {
			return []string{"-c", "sleep 0.3; echo \"listen tcp $0: bind: address already in use\"; exit 1", addr}
		},
		addr:         strings.TrimPrefix(foreign.URL, "http://"),
		readyPath:    "/readyz",
		logPath:      filepath.Join(t.TempDir(), "test-0.log"),
		readyTimeout: 10 * time.Second,
		stopGrace:    time.Second,
		log:          slog.New(slog.DiscardHandler),
	}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	err := p.WaitReady(context.Background())
	if !errors.Is(err, errAddrInUse) {
		t.Errorf("WaitReady with another process on the port: %v, want errAddrInUse", err)
	}
}

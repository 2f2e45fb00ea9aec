package region_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

// openNode serves a node through Server.Open (the real http.Server with its
// timeouts) on a loopback port.
func openNode(t *testing.T, cfg region.Config) (*node, string) {
	t.Helper()
	st, _ := storetest.New(t)
	return openNodeOn(t, st, payments.NewService(st, payments.Config{Region: "test", Window: time.Hour}), cfg)
}

func openNodeOn(t *testing.T, st *store.Store, pay *payments.Service, cfg region.Config) (*node, string) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Region = "test"
	cfg.Tokens = map[string]string{"tok-a": "tenant-a"}
	cfg.Registry = prometheus.NewRegistry()
	srv, err := region.NewServer(cfg, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return &node{t: t, url: srv.URL(), store: st, reg: cfg.Registry}, strings.TrimPrefix(srv.URL(), "http://")
}

// safetyBound keeps a broken server from hanging the test; it is never
// what a test asserts.
const safetyBound = 30 * time.Second

// readAnswer reads one HTTP answer from conn in the background.
func readAnswer(conn net.Conn) <-chan error {
	got := make(chan error, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			got <- err
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Errorf("answer %d %s", resp.StatusCode, b)
	}()
	return got
}

// TestTrickledBodyIsCut: a body that keeps arriving a byte at a time past
// the read timeout is answered 408 REQUEST_TIMEOUT (or the connection is
// closed) before it is complete, instead of being served.
func TestTrickledBodyIsCut(t *testing.T) {
	_, addr := openNode(t, region.Config{ReadTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(safetyBound))
	body := article + strings.Repeat(" ", 400)
	if _, err := fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\nIdempotency-Key: trickle-1\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		t.Fatal(err)
	}
	got := readAnswer(conn)
	tick := time.NewTicker(20 * time.Millisecond) // the client's pace, not an assertion
	defer tick.Stop()
	for i := 0; ; i++ {
		if i == len(body) {
			t.Fatalf("the whole body (%d bytes over %d ticks) was accepted; answer: %v", len(body), i, <-got)
		}
		select {
		case err := <-got:
			if err != nil && strings.HasPrefix(err.Error(), "answer ") {
				if !strings.Contains(err.Error(), "answer 408 ") || !strings.Contains(err.Error(), idem.ECodeRequestTimeout) {
					t.Fatalf("trickled body: %v, want 408 %s", err, idem.ECodeRequestTimeout)
				}
			}
			// An answer of 408 or a closed connection: cut either way.
			t.Logf("cut after %d of %d bytes: %v", i, len(body), err)
			return
		case <-tick.C:
		}
		if _, err := conn.Write([]byte{body[i]}); err != nil {
			t.Logf("cut after %d of %d bytes: %v", i, len(body), err)
			return // the server closed the connection
		}
	}
}

// TestIdleConnectionClosed: a keep-alive connection with no next request is
// closed by the server once the idle timeout has passed.
func TestIdleConnectionClosed(t *testing.T) {
	_, addr := openNode(t, region.Config{IdleTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(safetyBound))
	if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("healthz = %d close=%v, want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	// Wait for the server to close it: EOF, not our own safety deadline.
	_, err = br.ReadByte()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the idle connection was still open after %v", safetyBound)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(fmt.Sprint(err), "reset") {
		t.Fatalf("idle connection read = %v, want EOF", err)
	}
}

// TestPreferWaitOutlivesWriteTimeout: a request with Prefer: wait=N may take
// up to N seconds; the write timeout must not cut it. The original owner
// completes only after the write timeout has passed, and the waiting client
// still gets the owner's answer.
func TestPreferWaitOutlivesWriteTimeout(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	st, _ := storetest.New(t)
	waiting := make(chan struct{}, 1)
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour,
		Sleep: func(ctx context.Context, d time.Duration) error {
			select {
			case waiting <- struct{}{}:
			default:
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
				return nil
			}
		}})
	n, _ := openNodeOn(t, st, pay, region.Config{WriteTimeout: writeTimeout, ReadTimeout: writeTimeout})
	ctx := context.Background()
	cmd, _ := payments.ParseCommand([]byte(article), "")
	hashes, _ := cmd.Fingerprint()
	owner, err := st.Begin(ctx, idem.BeginRequest{
		Scope:         idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "wait-long"},
		RequestHashes: hashes, HashVersion: 1, Owner: "slow-node", LockFor: time.Minute, Window: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	go func() {
		done <- n.do(http.MethodPost, "/payments", "tok-a", map[string]string{"Idempotency-Key": "wait-long", "Prefer": "wait=20"}, article)
	}()
	<-waiting
	// Let the write timeout (and the body-read timeout) pass while the
	// request waits: that is the situation under test.
	<-time.After(3 * writeTimeout)
	final := `{"paymentId":"pay_from_owner"}`
	if err := st.Complete(ctx, owner.Lease, idem.Completion{Response: idem.Response{Status: 201, Body: []byte(final)}}); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.status != http.StatusCreated || string(a.body) != final {
		t.Errorf("Prefer: wait past the write timeout = %d %s, want the owner's 201 %s", a.status, a.body, final)
	}
}

// TestOversizedHeaderRefused: a header block over MaxHeaderBytes is refused
// with 431 before any handler runs.
func TestOversizedHeaderRefused(t *testing.T) {
	n, _ := openNode(t, region.Config{MaxHeaderBytes: 1 << 10})
	a := n.do(http.MethodGet, "/healthz", "", map[string]string{"X-Padding": strings.Repeat("p", 16<<10)}, "")
	if a.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB header over a 1 KiB bound = %d %s, want 431", a.status, a.body)
	}
	if a := n.do(http.MethodGet, "/healthz", "", nil, ""); a.status != http.StatusOK {
		t.Errorf("healthz = %d", a.status)
	}
}

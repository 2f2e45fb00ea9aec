package sidecar_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
)

// safetyBound keeps a broken proxy from hanging a test; it is never what a
// test asserts.
const safetyBound = 30 * time.Second

// TestProxyRefusesPathsOutsideTheRoute: a Proxy served on its own (no
// ServeMux in front to redirect unencoded dot segments) refuses every
// route path that an upstream could resolve outside the route with 400
// REQUEST_PATH_INVALID; the upstream receives none of them and nothing is
// stored.
func TestProxyRefusesPathsOutsideTheRoute(t *testing.T) {
	f := newFixture(t, "")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i, p := range refusedPaths {
		if !strings.HasPrefix(p, "/transfers/") {
			continue // not the route's: 404
		}
		req, err := http.NewRequest(http.MethodPost, f.url, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = p // sent as it is
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("path-%d", i))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if a := (answer{resp.StatusCode, resp.Header, string(b)}); a.status != http.StatusBadRequest || a.code() != idem.ECodePathInvalid {
			t.Errorf("POST %s: %d %s, want 400 %s", p, a.status, a.body, idem.ECodePathInvalid)
		}
	}
	f.up.mu.Lock()
	uris := f.up.uris
	f.up.mu.Unlock()
	if len(uris) != 0 {
		t.Errorf("the upstream received %q", uris)
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM idempotency_records`); n != 0 {
		t.Errorf("%d records stored for refused paths", n)
	}
}

// TestProxyDeclaredBodyOverLimit: a request whose Content-Length is over
// Options.MaxBodyBytes, with Expect: 100-continue, is answered 413
// REQUEST_BODY_TOO_LARGE at once: the first line the client reads is the
// 413, never 100 Continue (which the proxy used to send by reading the
// body to keep it).
func TestProxyDeclaredBodyOverLimit(t *testing.T) {
	f := newFixture(t, "")
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(safetyBound))
	if _, err := io.WriteString(conn, "POST /transfers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\nIdempotency-Key: big\r\n"+
		"Content-Type: application/json\r\nContent-Length: 900000000\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "HTTP/1.1 413 ") {
		t.Fatalf("first line %q, want HTTP/1.1 413", first)
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(first), br)), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if a := (answer{resp.StatusCode, resp.Header, string(b)}); a.code() != idem.ECodeBodyTooLarge {
		t.Errorf("%d %s, want 413 %s", a.status, a.body, idem.ECodeBodyTooLarge)
	}
	if n := storetest.Count(t, f.st, `SELECT count(*) FROM idempotency_records`); n != 0 {
		t.Errorf("%d records stored", n)
	}
}

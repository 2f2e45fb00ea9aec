package idemhttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
)

// TestCheckContentLength: only a declared length over the limit is
// refused; an undeclared one (-1, chunked) is left to the reading.
func TestCheckContentLength(t *testing.T) {
	for _, tc := range []struct {
		length  int64
		refused bool
	}{{-1, false}, {0, false}, {1024, false}, {1025, true}, {900000000, true}} {
		r := &http.Request{ContentLength: tc.length}
		err := idemhttp.CheckContentLength(r, 1024)
		if refused := err != nil; refused != tc.refused || (refused && idem.ErrorCode(err) != idem.ECodeBodyTooLarge) {
			t.Errorf("Content-Length %d: %v, want refused %v", tc.length, err, tc.refused)
		}
	}
}

// TestDeclaredBodyOverLimitAnsweredAtOnce: behind the middleware, a request
// whose Content-Length is over MaxBodyBytes, with Expect: 100-continue,
// reads 413 REQUEST_BODY_TOO_LARGE as the first line of its answer, never
// 100 Continue (which the middleware used to invite by reading the body),
// and neither the handler nor the store sees it. A body within the limit
// is still invited and served.
func TestDeclaredBodyOverLimitAnsweredAtOnce(t *testing.T) {
	var n atomic.Int32
	f := newFixture(t, created(&n), engine.Options{}, idemhttp.Options{MaxBodyBytes: 1024})
	send := func(length int, body string) (string, *http.Response) {
		t.Helper()
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // a safety bound, never asserted
		if _, err := fmt.Fprintf(conn, "POST /accounts/acc_1/transfers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\n"+
			"Idempotency-Key: big-%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", length, length); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		first, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if body != "" && strings.HasPrefix(first, "HTTP/1.1 100 ") {
			if _, err := br.ReadString('\n'); err != nil { // the blank line after 100 Continue
				t.Fatal(err)
			}
			if _, err := io.WriteString(conn, body); err != nil {
				t.Fatal(err)
			}
			if first, err = br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(first), br)), nil)
		if err != nil {
			t.Fatal(err)
		}
		return first, resp
	}
	first, resp := send(900000000, "")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(first, "HTTP/1.1 413 ") || errorCode(t, answer{resp.StatusCode, resp.Header, string(b)}) != idem.ECodeBodyTooLarge {
		t.Errorf("first line %q, answer %s; want HTTP/1.1 413 %s", first, b, idem.ECodeBodyTooLarge)
	}
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times", n.Load())
	}
	body := `{"amount":"5.00"}`
	first, resp = send(len(body), body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || n.Load() != 1 {
		t.Errorf("a body within the limit: %q %d, handler runs %d; want 201 after 100 Continue", first, resp.StatusCode, n.Load())
	}
}

package region_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// pathRecorder is an upstream that records the path of every request it
// receives, as sent (escaped), and answers 201.
type pathRecorder struct {
	url   string
	mu    sync.Mutex
	paths []string
}

func newPathRecorder(t *testing.T) *pathRecorder {
	t.Helper()
	u := &pathRecorder{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.paths = append(u.paths, r.URL.EscapedPath())
		u.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

func (u *pathRecorder) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.paths)
}

// openSidecarNode serves POST /transfers as create_transfer in front of
// upstream through the node's real server (Server.Open), with the
// coordination API's operations and payments beside it.
func openSidecarNode(t *testing.T, upstream string) (*node, string) {
	t.Helper()
	st, _ := storetest.New(t)
	return openNodeOn(t, st, payments.NewService(st, payments.Config{Region: "test", Window: time.Hour}),
		region.Config{Operations: testOperations, Sidecar: sidecarRoutes(t, upstream)})
}

// sendTarget sends a POST whose request target is exactly target (no
// client-side cleaning or re-encoding) and does not follow redirects.
func sendTarget(t *testing.T, base, target string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base, strings.NewReader(`{"amount":"5.00"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = target
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", "k-"+url.PathEscape(target))
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestSidecarPathsStayInsideTheRoute: through the node's real server, a
// path that an upstream which decodes (once or more) would resolve outside
// the route's prefix is refused with 400 REQUEST_PATH_INVALID before
// anything is stored or proxied; the upstream, which records every path it
// receives, gets only the paths that stay inside the route, exactly as
// sent. (The encoded ones used to reach it as sent.)
func TestSidecarPathsStayInsideTheRoute(t *testing.T) {
	up := newPathRecorder(t)
	n, _ := openSidecarNode(t, up.url)
	refused := []string{
		"/transfers/%2e%2e/admin",
		"/transfers/..%2fadmin",
		"/transfers/%2E%2E/admin",
		"/transfers/.%2e/admin",
		"/transfers/%2e./admin",
		"/transfers/%2e",
		"/transfers/%2e%2e",
		"/transfers/x/%2e%2e/%2e%2e/admin",
		"/transfers/..%2Fadmin",
		"/transfers/x%2f..%2f..%2fadmin",
		"/transfers/..%5cadmin",
		"/transfers/..%5Cadmin",
		`/transfers/..\admin`,
		"/transfers/%252e%252e/admin",
		"/transfers/%252E%252E/admin",
		"/transfers/..%252fadmin",
		"/transfers/..%255cadmin",
		"/transfers/%25252e%25252e/admin",
		"/transfers/%25252525252e",
		"/transfers/..;/admin",
		"/transfers/%2e%2e;jsessionid=1/admin",
		"/transfers/..%00/admin",
		"/transfers/%c0%ae%c0%ae/admin",
	}
	for _, target := range refused {
		a := sendTarget(t, n.url, target)
		if a.status != http.StatusBadRequest || a.code() != idem.ECodePathInvalid ||
			a.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("POST %s: %d %s, want 400 %s", target, a.status, a.body, idem.ECodePathInvalid)
		}
		if strings.Contains(string(a.body), "admin") {
			t.Errorf("POST %s: the answer quotes the path: %s", target, a.body)
		}
	}
	// net/http's mux redirects an unencoded dot segment (307, to the
	// cleaned path): nothing is proxied either.
	for _, target := range []string{"/transfers/../admin", "/transfers/./x", "/transfers/x/../../admin"} {
		if a := sendTarget(t, n.url, target); a.status != http.StatusTemporaryRedirect {
			t.Errorf("POST %s: %d %s, want the mux's 307", target, a.status, a.body)
		}
	}
	if got := up.received(); len(got) != 0 {
		t.Fatalf("the upstream received %q", got)
	}
	if c := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); c != 0 {
		t.Errorf("%d records stored for refused paths", c)
	}

	// Encoded characters that make no dot segment or separator pass, and
	// reach the upstream as sent, under the route.
	accepted := []string{
		"/transfers/report%2ejson",
		"/transfers/100%25",
		"/transfers/a%20b",
		"/transfers/%7euser/x",
		"/transfers/...",
		"/transfers/%C3%A9t%C3%A9",
	}
	for _, target := range accepted {
		if a := sendTarget(t, n.url, target); a.status != http.StatusCreated {
			t.Errorf("POST %s: %d %s, want the upstream's 201", target, a.status, a.body)
		}
	}
	if got := up.received(); !slices.Equal(got, accepted) {
		t.Errorf("the upstream received %q, want %q", got, accepted)
	}
}

// rawHead writes a request head (and no body) on a new connection to addr
// and returns the first line of the answer and the answer.
func rawHead(t *testing.T, addr, head string) (string, *http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(safetyBound))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the answer's first line: %v", err)
	}
	if !strings.HasPrefix(first, "HTTP/1.1 413 ") {
		return first, nil, nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(first), br)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return first, resp, b
}

// declaredOverLimit are the node's surfaces that take a body: a sidecar
// route, the payments route and the coordination API.
var declaredOverLimit = []struct{ name, target string }{
	{"sidecar", "/transfers/acc_1"},
	{"payments", "/payments"},
	{"coordination", "/v1/coordination/op/big-1/begin"},
}

// TestDeclaredBodyOverLimitAnsweredAtOnce: a request that declares a body
// over the node's limit and asks Expect: 100-continue is answered 413
// REQUEST_BODY_TOO_LARGE at once, never 100 Continue, on every surface, and
// the connection is closed; nothing is stored or proxied. (It used to get
// 100 Continue: the body was invited, then cut at the limit.)
func TestDeclaredBodyOverLimitAnsweredAtOnce(t *testing.T) {
	up := newPathRecorder(t)
	n, addr := openSidecarNode(t, up.url)
	for _, s := range declaredOverLimit {
		for _, token := range []string{"tok-a", "nobody"} {
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: big-1\r\n"+
				"Content-Type: application/json\r\nContent-Length: 900000000\r\nExpect: 100-continue\r\n\r\n", s.target, token)
			first, resp, body := rawHead(t, addr, head)
			if resp == nil {
				t.Errorf("%s (token %s): first line %q, want HTTP/1.1 413", s.name, token, first)
				continue
			}
			a := answer{status: resp.StatusCode, header: resp.Header, body: body}
			if a.code() != idem.ECodeBodyTooLarge || !resp.Close {
				t.Errorf("%s (token %s): %d %s, close %v; want 413 %s and the connection closed", s.name, token, a.status, a.body, resp.Close, idem.ECodeBodyTooLarge)
			}
		}
	}
	// Without Expect the answer is the same.
	first, _, _ := rawHead(t, addr, "POST /transfers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\nIdempotency-Key: big-2\r\nContent-Length: 900000000\r\n\r\n")
	if !strings.HasPrefix(first, "HTTP/1.1 413 ") {
		t.Errorf("without Expect: first line %q, want HTTP/1.1 413", first)
	}
	if got := up.received(); len(got) != 0 {
		t.Errorf("the upstream received %q", got)
	}
	if c := storetest.Count(t, n.store, `SELECT count(*) FROM idempotency_records`); c != 0 {
		t.Errorf("%d records stored for refused bodies", c)
	}
}

// zeros is an endless body that counts what is read of it.
type zeros struct {
	mu   sync.Mutex
	read int64
}

func (z *zeros) Read(p []byte) (int, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	clear(p)
	z.read += int64(len(p))
	return len(p), nil
}

func (z *zeros) count() int64 {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.read
}

// TestDeclaredBodyOverLimitNotSentByGoClients: Go's http.Client with
// Transport.ExpectContinueTimeout waits for 100 Continue before it sends
// a body; the node's at-once 413 means it sends none of it, on every
// surface, while a body within the limit is still invited and served.
// (The client used to send the body, cut at the limit.)
func TestDeclaredBodyOverLimitNotSentByGoClients(t *testing.T) {
	up := newPathRecorder(t)
	n, _ := openSidecarNode(t, up.url)
	// Long enough that the client never sends the body unasked; the node
	// answers at once (safetyBound only keeps a broken node from hanging
	// the test).
	tr := &http.Transport{ExpectContinueTimeout: safetyBound}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	post := func(target string, body io.Reader, length int64) (answer, error) {
		req, err := http.NewRequest(http.MethodPost, n.url+target, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Idempotency-Key", "go-1")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Expect", "100-continue")
		resp, err := client.Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
	}
	for _, s := range declaredOverLimit {
		z := &zeros{}
		a, err := post(s.target, z, 900000000)
		if err != nil {
			t.Errorf("%s: %v", s.name, err)
			continue
		}
		if a.status != http.StatusRequestEntityTooLarge || a.code() != idem.ECodeBodyTooLarge {
			t.Errorf("%s: %d %s, want 413 %s", s.name, a.status, a.body, idem.ECodeBodyTooLarge)
		}
		if sent := z.count(); sent != 0 {
			t.Errorf("%s: the client sent %d bytes of the body, want none", s.name, sent)
		}
	}
	body := `{"amount":"5.00"}`
	if a, err := post("/transfers/acc_1", strings.NewReader(body), int64(len(body))); err != nil || a.status != http.StatusCreated {
		t.Errorf("a body within the limit, with Expect: %d %s %v, want the upstream's 201", a.status, a.body, err)
	}
	if got := up.received(); !slices.Equal(got, []string{"/transfers/acc_1"}) {
		t.Errorf("the upstream received %q, want the one body within the limit", got)
	}
}

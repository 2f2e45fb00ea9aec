package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// upstream is the service behind the sidecar, the thing these tests break
// and observe: it counts executions by the derived key it receives and
// remembers each execution's answer for its lookup route.
type upstream struct {
	url string

	mu sync.Mutex
	// executions by derived key; received counts every request.
	executions map[string]int
	received   map[string]int
	answers    map[string]string
	headers    []http.Header
	bodies     []string
	remotes    []string
	uris       []string
	// fail answers the next n requests of a key with failStatus.
	fail       map[string]int
	failStatus int
	// hangUp drops the connection after executing the next request of a
	// key, so its answer is lost.
	hangUp map[string]bool
	// dedup makes the upstream idempotent on the key: a repeat answers the
	// first answer without executing.
	dedup bool
	// delay holds the answer of a key's requests (after executing) this
	// long.
	delay map[string]time.Duration
	// next lets a text/event-stream answer (X-Answer: events) send its
	// second event.
	next chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{executions: map[string]int{}, received: map[string]int{}, answers: map[string]string{},
		fail: map[string]int{}, hangUp: map[string]bool{}, delay: map[string]time.Duration{}, failStatus: http.StatusServiceUnavailable,
		next: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /transfers/by-key/{k}", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		a, ok := u.answers[r.PathValue("k")]
		u.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, a)
	})
	mux.HandleFunc("/transfers", u.serve)
	mux.HandleFunc("/transfers/", u.serve)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.received[key]++
	u.headers = append(u.headers, r.Header.Clone())
	u.bodies = append(u.bodies, string(body))
	u.remotes = append(u.remotes, r.RemoteAddr)
	u.uris = append(u.uris, r.Method+" "+r.URL.RequestURI())
	if u.fail[key] > 0 {
		u.fail[key]--
		u.mu.Unlock()
		w.WriteHeader(u.failStatus)
		_, _ = io.WriteString(w, `{"error":"try again"}`)
		return
	}
	if a, ok := u.answers[key]; ok && u.dedup {
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, a)
		return
	}
	u.executions[key]++
	n := 0
	for _, c := range u.executions {
		n += c
	}
	a := fmt.Sprintf(`{"transfer":"tr_%d","tenant":%q,"body":%s}`, n, r.Header.Get("Idem-Tenant"), orNull(body))
	u.answers[key] = a
	hang := u.hangUp[key]
	delete(u.hangUp, key)
	delay := u.delay[key]
	u.mu.Unlock()
	time.Sleep(delay)
	if hang {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/transfers/tr_"+fmt.Sprint(n))
	w.Header().Set("X-Upstream", "1")
	w.Header().Set("X-Request-Id", "req_"+fmt.Sprint(n))
	w.Header().Set("Set-Cookie", "session=s"+fmt.Sprint(n))
	// Headers of the contract, which the sidecar must not pass on.
	w.Header().Set("Idempotent-Replayed", "true")
	w.Header().Set("Idempotency-Window", "1")
	u.answer(w, r.Header.Get("X-Answer"), a)
}

// answer writes a, shaped by the request's X-Answer header:
//
//   - "length:N": a padded to N bytes, with a Content-Length;
//   - "chunked:N": a padded to N bytes, without one;
//   - "cut:N": a padded to N bytes, without a Content-Length, broken off
//     after half of it;
//   - "events": a text/event-stream of two events, "one" and, once next is
//     closed (or after 5s, "late" instead), "two";
//   - anything else: a as it is.
func (u *upstream) answer(w http.ResponseWriter, shape, a string) {
	kind, n, _ := strings.Cut(shape, ":")
	size, _ := strconv.Atoi(n)
	body := a
	if size > len(a) {
		body += strings.Repeat(" ", size-len(a))
	}
	rc := http.NewResponseController(w)
	switch kind {
	case "length":
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	case "chunked":
		w.WriteHeader(http.StatusCreated)
		_ = rc.Flush()
		_, _ = io.WriteString(w, body)
		return
	case "cut":
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body[:len(body)/2])
		_ = rc.Flush()
		if conn, _, err := rc.Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	case "events":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: one\n\n")
		_ = rc.Flush()
		second := "two"
		select {
		case <-u.next:
		case <-time.After(5 * time.Second):
			second = "late"
		}
		_, _ = io.WriteString(w, "data: "+second+"\n\n")
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, body)
}

func orNull(b []byte) string {
	if strings.TrimSpace(string(b)) == "" {
		return "null"
	}
	return string(b)
}

func (u *upstream) counts() (executions, received map[string]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, r := map[string]int{}, map[string]int{}
	for k, v := range u.executions {
		e[k] = v
	}
	for k, v := range u.received {
		r[k] = v
	}
	return e, r
}

func (u *upstream) total() int {
	e, _ := u.counts()
	n := 0
	for _, c := range e {
		n += c
	}
	return n
}

func (u *upstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers[len(u.headers)-1]
}

// Command upstream is a plain HTTP service with no idempotency of its own,
// the service the sidecar walkthrough (and the chaos harness's sidecar
// scenario) puts idemd in front of. Every POST /transfers executes: it
// makes a new transfer. It remembers which transfer each Idempotency-Key
// (the sidecar's derived key) made, so that
//
//	GET /transfers/by-key/{key}  answers that transfer, or 404
//	GET /stats                   answers {"executions":N,"byKey":{key:count}}
//
// where a count above 1 is a duplicate execution. It prints
// "upstream listening on http://ADDR" once it serves.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

type service struct {
	mu         sync.Mutex
	executions int
	byKey      map[string]int
	answers    map[string][]byte
}

func (s *service) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	var in struct {
		Amount string `json:"amount"`
		To     string `json:"to"`
	}
	if err := json.Unmarshal(body, &in); err != nil || in.Amount == "" || in.To == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":"want {\"amount\":\"...\",\"to\":\"...\"}"}`+"\n")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.executions++
	id := fmt.Sprintf("tr_%d", s.executions)
	out, _ := json.Marshal(map[string]string{"id": id, "amount": in.Amount, "to": in.To, "tenant": r.Header.Get("Idem-Tenant")})
	out = append(out, '\n')
	if key != "" {
		s.byKey[key]++
		s.answers[key] = out
	}
	s.mu.Unlock()
	fmt.Printf("executed %s key=%s tenant=%s fencing-token=%s\n", id, key, r.Header.Get("Idem-Tenant"), r.Header.Get("Idem-Fencing-Token"))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/transfers/"+id)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

func (s *service) byKeyLookup(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out, ok := s.answers[r.PathValue("key")]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func (s *service) stats(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out, _ := json.Marshal(map[string]any{"executions": s.executions, "byKey": s.byKey})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on (port 0 picks one)")
	flag.Parse()
	s := &service{byKey: map[string]int{}, answers: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", s.create)
	mux.HandleFunc("GET /transfers/by-key/{key}", s.byKeyLookup)
	mux.HandleFunc("GET /stats", s.stats)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("upstream listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

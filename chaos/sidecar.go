package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"

	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/sidecar"
)

// The sidecar scenario's route: POST /transfers of every node, proxied to
// an upstream the harness runs in process and observes.
const (
	sidecarOperation = "create_transfer"
	// sidecarCallTimeout is the route's upstream call timeout (its records'
	// lock timeout is this plus the sidecar's margin).
	sidecarCallTimeout = 2 * time.Second
)

// sidecarUpstream is the service behind the sidecar route: a plain HTTP
// service that executes every request it gets and counts executions by the
// Idempotency-Key (the derived key) it receives; its lookup route answers
// what a derived key executed.
type sidecarUpstream struct {
	srv *http.Server
	url string

	mu      sync.Mutex
	n       int
	byKey   map[string]int
	answers map[string][]byte
	// lose drops the connection after every third execution, before the
	// answer (SidecarLoseAnswers).
	lose bool
}

func startSidecarUpstream() (*sidecarUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: sidecar upstream: %w", err)
	}
	u := &sidecarUpstream{url: "http://" + ln.Addr().String(), byKey: map[string]int{}, answers: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", u.execute)
	mux.HandleFunc("GET /transfers/by-key/{key}", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		a, ok := u.answers[r.PathValue("key")]
		u.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(a)
	})
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

func (u *sidecarUpstream) execute(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the connection is gone; nothing executed
	}
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.n++
	u.byKey[key]++
	var request any = string(body) // a form
	if json.Valid(body) {
		request = json.RawMessage(body)
	}
	a, _ := json.Marshal(map[string]any{"transfer": fmt.Sprintf("tr_%d", u.n), "tenant": r.Header.Get("Idem-Tenant"), "request": request})
	u.answers[key] = a
	lose := u.lose && u.n%3 == 0
	u.mu.Unlock()
	if lose {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(a)
}

// routes is the nodes' --proxy-routes.
func (u *sidecarUpstream) routes() string {
	return fmt.Sprintf("POST /transfers=%s@%s;lookup=%s/transfers/by-key/{derivedKey};timeout=%s",
		sidecarOperation, u.url, u.url, sidecarCallTimeout)
}

func (u *sidecarUpstream) executions() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]int, len(u.byKey))
	for k, v := range u.byKey {
		out[k] = v
	}
	return out
}

func (u *sidecarUpstream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = u.srv.Shutdown(ctx)
}

// sidecarLoseAnswers makes the sidecar's upstream lose answers.
type sidecarLoseAnswers struct{ env *Env }

// SidecarLoseAnswers makes the sidecar scenario's upstream drop the
// connection after every third execution, before answering: the node sees
// a request written and no answer (202 OUTCOME_UNKNOWN), and the
// route's lookup must settle it without a second execution.
func SidecarLoseAnswers(env *Env) Fault { return &sidecarLoseAnswers{env: env} }

func (f *sidecarLoseAnswers) Name() string { return "sidecar-lose-answers" }
func (f *sidecarLoseAnswers) Available(*cluster.Cluster) bool {
	return f.env != nil && f.env.sidecar != nil
}
func (f *sidecarLoseAnswers) Inject(context.Context, *cluster.Cluster) error {
	f.env.sidecar.setLose(true)
	return nil
}
func (f *sidecarLoseAnswers) Heal(context.Context, *cluster.Cluster) error {
	f.env.sidecar.setLose(false)
	return nil
}

func (u *sidecarUpstream) setLose(on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.lose = on
}

// SidecarAnswer is one answer a sidecar client got.
type SidecarAnswer struct {
	Node string `json:"node"`
	// Sent is the body the request sent, when not the command's Body (a
	// form's fields in another order).
	Sent     string `json:"sent,omitempty"`
	Status   int    `json:"status"`
	Body     string `json:"body,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	Error    string `json:"error,omitempty"`
	Sweep    bool   `json:"sweep,omitempty"`
}

// sidecarKey is one command of the sidecar traffic and every answer it got.
type sidecarKey struct {
	Tenant  string          `json:"tenant"`
	Key     string          `json:"key"`
	Derived string          `json:"derivedKey"`
	Body    string          `json:"body"`
	Answers []SidecarAnswer `json:"answers"`
	// fields are a form command's pairs, in Body's order (nil: JSON).
	fields [][2]string
}

// final reports whether a is an answer the command ends with: a 2xx other
// than 202 (OUTCOME_UNKNOWN).
func (a SidecarAnswer) final() bool {
	return a.Error == "" && a.Status >= 200 && a.Status < 300 && a.Status != http.StatusAccepted
}

// sidecarTraffic drives the sidecar route: each command's first attempt goes
// to every region at once (a cross-region race, forwarded to the tenant's
// home), then retries go to random nodes until a 2xx answer. With form,
// commands are application/x-www-form-urlencoded, and every request but
// the first sends the fields in another order.
type sidecarTraffic struct {
	up      *sidecarUpstream
	form    bool
	runID   string
	seed    uint64
	regions []string
	targets map[string][]target
	tokens  map[string]string
	tenants []string
	http    *http.Client

	mu   sync.Mutex
	keys []*sidecarKey
}

func newSidecarTraffic(up *sidecarUpstream, form bool, runID string, seed uint64, regions []string, targets map[string][]target, tokens map[string]string, tlsConfig *tls.Config) *sidecarTraffic {
	tenants := make([]string, 0, len(tokens))
	for t := range tokens {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	tr := &http.Transport{MaxIdleConnsPerHost: 4, TLSClientConfig: tlsConfig}
	return &sidecarTraffic{up: up, form: form, runID: runID, seed: seed, regions: regions, targets: targets, tokens: tokens, tenants: tenants,
		http: &http.Client{Transport: tr, Timeout: 3 * sidecarCallTimeout}}
}

// run sends commands from clients concurrent clients until traffic ends;
// open commands keep retrying until drain ends.
func (s *sidecarTraffic) run(traffic, drain context.Context, clients int) {
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(s.seed, uint64(i)+1000))
			for n := 0; traffic.Err() == nil; n++ {
				tenant := s.tenants[(i+n)%len(s.tenants)]
				k := &sidecarKey{Tenant: tenant, Key: fmt.Sprintf("%s-sc%d-%d", s.runID, i, n)}
				if s.form {
					k.fields = formCommand(rng, i)
					k.Body = encodeForm(k.fields, true)
				} else {
					k.Body = fmt.Sprintf(`{"amount":"%d.00","to":"acc_%d"}`, 1+rng.IntN(500), i)
				}
				k.Derived = sidecar.DerivedKey(tenant, sidecarOperation, k.Key, 0)
				s.mu.Lock()
				s.keys = append(s.keys, k)
				s.mu.Unlock()
				s.drive(drain, rng, k)
				sleepCtx(traffic, time.Duration(20+rng.IntN(60))*time.Millisecond)
			}
		})
	}
	wg.Wait()
	s.http.CloseIdleConnections()
}

// drive races the first attempt over every region, then retries until a
// 2xx answer or the end of the drain.
func (s *sidecarTraffic) drive(ctx context.Context, rng *rand.Rand, k *sidecarKey) {
	var wg sync.WaitGroup
	first := make([]SidecarAnswer, len(s.regions))
	picks := make([]target, len(s.regions))
	bodies := make([]string, len(s.regions))
	for i, r := range s.regions {
		picks[i] = s.targets[r][rng.IntN(len(s.targets[r]))]
		bodies[i] = k.Body
		if i > 0 {
			bodies[i] = s.body(rng, k)
		}
	}
	for i := range s.regions {
		wg.Go(func() { first[i] = s.send(ctx, picks[i], k, bodies[i]) })
	}
	wg.Wait()
	s.record(k, first...)
	done := slices.ContainsFunc(first, SidecarAnswer.final)
	for attempt := 0; !done && ctx.Err() == nil && attempt < 200; attempt++ {
		sleepCtx(ctx, time.Duration(50+rng.IntN(150))*time.Millisecond)
		r := s.regions[rng.IntN(len(s.regions))]
		a := s.send(ctx, s.targets[r][rng.IntN(len(s.targets[r]))], k, s.body(rng, k))
		s.record(k, a)
		done = a.final()
	}
}

func (s *sidecarTraffic) record(k *sidecarKey, a ...SidecarAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k.Answers = append(k.Answers, a...)
}

// body is what a retry of k sends: a form's fields in a new order, spaces
// as '+' or "%20" (the same command); a JSON command as it is.
func (s *sidecarTraffic) body(rng *rand.Rand, k *sidecarKey) string {
	if k.fields == nil {
		return k.Body
	}
	return encodeForm(shuffleForm(rng, k.fields), rng.IntN(2) == 0)
}

// formCommand is a form command of client i, as payment SDKs send them:
// nested names, a repeated name and values that need escaping.
func formCommand(rng *rand.Rand, i int) [][2]string {
	return [][2]string{
		{"amount", fmt.Sprintf("%d.00", 1+rng.IntN(500))},
		{"currency", "eur"},
		{"to", fmt.Sprintf("acc_%d", i)},
		{"description", "rent & bills + café"},
		{"metadata[order_id]", fmt.Sprintf("ord %d", rng.IntN(1_000_000))},
		{"expand[]", "destination"},
		{"expand[]", "balance_transaction"},
	}
}

// shuffleForm returns fields in a random order, keeping a repeated name's
// values in the order they had (their order is part of the command).
func shuffleForm(rng *rand.Rand, fields [][2]string) [][2]string {
	out := slices.Clone(fields)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	next := map[string]int{}
	for i := range out {
		name := out[i][0]
		n := next[name]
		for _, f := range fields {
			if f[0] != name {
				continue
			}
			if n == 0 {
				out[i] = f
				break
			}
			n--
		}
		next[name]++
	}
	return out
}

// encodeForm encodes fields in their order, spaces as '+' or as "%20".
func encodeForm(fields [][2]string, plus bool) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(f[0]) + "=" + url.QueryEscape(f[1]))
	}
	if plus {
		return b.String()
	}
	// QueryEscape writes a space as '+' and a '+' as "%2B".
	return strings.ReplaceAll(b.String(), "+", "%20")
}

func (s *sidecarTraffic) send(ctx context.Context, t target, k *sidecarKey, body string) SidecarAnswer {
	a := SidecarAnswer{Node: t.node}
	if body != k.Body {
		a.Sent = body
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/transfers", strings.NewReader(body))
	if err != nil {
		a.Error = err.Error()
		return a
	}
	req.Header.Set("Authorization", "Bearer "+s.tokens[k.Tenant])
	req.Header.Set("Idempotency-Key", k.Key)
	req.Header.Set("Content-Type", "application/json")
	if k.fields != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Prefer", "wait=2")
	resp, err := s.http.Do(req)
	if err != nil {
		a.Error = firstLine(err.Error())
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.Error = firstLine(err.Error())
		return a
	}
	a.Status, a.Body, a.Replayed = resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
	return a
}

// sweepAttempts bounds the sends of one command's sweep resend.
const sweepAttempts = 5

// sweep resends every answered command once, to a random region: it must
// be a replay of the answer.
func (s *sidecarTraffic) sweep(ctx context.Context) {
	s.mu.Lock()
	keys := slices.Clone(s.keys)
	s.mu.Unlock()
	rng := rand.New(rand.NewPCG(s.seed, 7))
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		answered := slices.ContainsFunc(k.Answers, SidecarAnswer.final)
		s.mu.Unlock()
		if !answered {
			continue
		}
		r := s.regions[rng.IntN(len(s.regions))]
		t := s.targets[r][rng.IntN(len(s.targets[r]))]
		a := s.send(ctx, t, k, s.body(rng, k))
		// A resend that got no answer (a timeout on a loaded machine) or
		// a 503 is sent again, as a client would: it is recorded as the
		// call it was, and only the answer the sweep ends with must be a
		// replay.
		for attempt := 1; attempt < sweepAttempts && (a.Error != "" || a.Status == http.StatusServiceUnavailable) && ctx.Err() == nil; attempt++ {
			s.record(k, a)
			time.Sleep(200 * time.Millisecond)
			a = s.send(ctx, t, k, s.body(rng, k))
		}
		a.Sweep = true
		s.record(k, a)
	}
	s.http.CloseIdleConnections()
}

// sidecarResult is what the sidecar checks look at.
type sidecarResult struct {
	keys       []*sidecarKey
	executions map[string]int
}

func (s *sidecarTraffic) result() *sidecarResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]*sidecarKey, len(s.keys))
	for i, k := range s.keys {
		c := *k
		c.Answers = slices.Clone(k.Answers)
		keys[i] = &c
	}
	return &sidecarResult{keys: keys, executions: s.up.executions()}
}

// checkSidecarSingleExecution: the upstream executed every derived key at
// most once, and a command answered 2xx exactly once.
func checkSidecarSingleExecution(in *checkInput) CheckResult {
	r := newResult(CheckSidecarSingleExecution)
	sc := in.sidecar
	if sc == nil {
		r.Skipped = true
		return r.done("not a sidecar scenario")
	}
	known := map[string]*sidecarKey{}
	answered := 0
	for _, k := range sc.keys {
		known[k.Derived] = k
		n := sc.executions[k.Derived]
		if n > 1 {
			r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: fmt.Sprintf("the upstream executed derived key %s %d times", k.Derived, n), Rows: []any{k}})
		}
		if slices.ContainsFunc(k.Answers, SidecarAnswer.final) {
			answered++
			if n == 0 {
				r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: "answered 2xx, but the upstream never executed its derived key", Rows: []any{k}})
			}
		}
	}
	for d, n := range sc.executions {
		if known[d] == nil {
			r.fail(CounterExample{Key: d, Summary: fmt.Sprintf("the upstream executed a derived key no command has (%d times)", n)})
		}
	}
	if len(sc.keys) == 0 {
		r.fail(CounterExample{Summary: "no sidecar traffic"})
	}
	return r.done("%d command(s), %d answered 2xx, %d derived key(s) executed", len(sc.keys), answered, len(sc.executions))
}

// checkSidecarIdenticalAnswers: every 2xx answer of one command is the same
// status and bytes, the sweep's resend is a replay of it, and no retry of
// the same command was refused as a different request.
func checkSidecarIdenticalAnswers(in *checkInput) CheckResult {
	r := newResult(CheckSidecarIdenticalAnswers)
	sc := in.sidecar
	if sc == nil {
		r.Skipped = true
		return r.done("not a sidecar scenario")
	}
	n := 0
	for _, k := range sc.keys {
		var first *SidecarAnswer
		for i := range k.Answers {
			a := &k.Answers[i]
			switch {
			case a.Status == http.StatusConflict && bytes.Contains([]byte(a.Body), []byte("IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST")):
				r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: "the same command was refused as a different request", Rows: []any{k}})
			case a.Status == http.StatusInternalServerError:
				r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: "answered 500", Rows: []any{k}})
			case a.Sweep && (!a.final() || !a.Replayed):
				r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: fmt.Sprintf("the sweep's resend answered %d (replayed %v), not a replay", a.Status, a.Replayed), Rows: []any{k}})
			}
			if !a.final() {
				continue
			}
			n++
			if first == nil {
				first = a
				continue
			}
			if a.Status != first.Status || a.Body != first.Body {
				r.fail(CounterExample{Key: k.Tenant + "/" + k.Key, Summary: fmt.Sprintf("answers differ: %d %q and %d %q", first.Status, first.Body, a.Status, a.Body), Rows: []any{k}})
				break
			}
		}
	}
	if n == 0 && len(sc.keys) > 0 {
		r.fail(CounterExample{Summary: "no sidecar command was answered 2xx"})
	}
	return r.done("%d 2xx answer(s) over %d command(s)", n, len(sc.keys))
}

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
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Kinds of soak calls.
const (
	// SoakFresh: a new payment sent to a node of the tenant's home region.
	SoakFresh = "fresh"
	// SoakForwarded: a new payment sent to a region that is not the
	// tenant's home, which forwards it.
	SoakForwarded = "forwarded"
	// SoakReplay: a payment that got its answer, resent (re-serialised, to
	// any region): it must be replayed byte for byte.
	SoakReplay = "replay"
	// SoakConflict: a key that got its answer, reused with another amount:
	// it must be refused with 409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST.
	SoakConflict = "conflict"
	// SoakSidecar: a new transfer through a node's sidecar route.
	SoakSidecar = "sidecar"
	// SoakSidecarReplay: a transfer that got its answer, resent through
	// another node's sidecar route: replayed byte for byte.
	SoakSidecarReplay = "sidecar-replay"
)

// soakMix weights the kinds of the soak's calls.
var soakMix = []struct {
	kind   string
	weight int
}{
	{SoakFresh, 35}, {SoakForwarded, 20}, {SoakReplay, 20}, {SoakConflict, 5}, {SoakSidecar, 15}, {SoakSidecarReplay, 5},
}

// SoakKinds lists the kinds of calls, in the order reports show them.
func SoakKinds() []string {
	out := make([]string, len(soakMix))
	for i, m := range soakMix {
		out[i] = m.kind
	}
	return out
}

// SoakCounts counts one kind's calls: answers as the contract says (ok),
// errors (a timeout, a transport error, a 5xx, 409 in progress, 202
// outcome unknown: what a fault may cause, retried by a real client), and
// wrong answers (a replay that differs from the first answer or is not
// marked, a reused key that is not refused, a fresh payment refused).
type SoakCounts struct {
	Calls  int64 `json:"calls"`
	OK     int64 `json:"ok"`
	Errors int64 `json:"errors"`
	Wrong  int64 `json:"wrong"`
}

// soakAnswered is a call that got its final answer, kept for replays and
// conflicts.
type soakAnswered struct {
	tenant string
	key    string
	cmd    Command // payments
	body   []byte  // sidecar: the request's body
	hash   string  // answerHash of the first answer
}

// soakInterval accumulates one sampling interval's calls.
type soakInterval struct {
	calls, errors, wrong int64
	latencies            []float64 // ms, every call of the interval
	byKind               map[string]int64
}

// soakTraffic runs the soak's clients: closed loops without retries (a
// soak measures the service, the chaos scenarios check retries), recording
// counts and latencies per interval instead of every call, so that an hour
// of traffic costs the harness little memory.
type soakTraffic struct {
	runID   string
	seed    uint64
	regions []string
	targets map[string][]target
	tenants []string
	tokens  map[string]string
	homes   map[string]string
	tls     *tls.Config
	sidecar bool
	timeout time.Duration

	mu       sync.Mutex
	cur      soakInterval
	counts   map[string]*SoakCounts
	examples map[string][]string // kind -> a few wrong answers, for the report

	n atomic.Int64 // calls, for the progress line
}

// soakRecentKeys bounds how many answered keys each client keeps for its
// replays and conflicts.
const soakRecentKeys = 256

func newSoakTraffic(runID string, seed uint64, regions []string, targets map[string][]target, tokens, homes map[string]string, tlsConfig *tls.Config, sidecar bool) *soakTraffic {
	tenants := make([]string, 0, len(tokens))
	for t := range tokens {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	t := &soakTraffic{runID: runID, seed: seed, regions: regions, targets: targets, tenants: tenants, tokens: tokens,
		homes: homes, tls: tlsConfig, sidecar: sidecar, timeout: 2 * time.Second,
		counts: map[string]*SoakCounts{}, examples: map[string][]string{}}
	for _, k := range SoakKinds() {
		t.counts[k] = &SoakCounts{}
	}
	t.cur.byKind = map[string]int64{}
	return t
}

// take returns the interval accumulated since the last take and starts a
// new one.
func (t *soakTraffic) take() soakInterval {
	t.mu.Lock()
	defer t.mu.Unlock()
	iv := t.cur
	t.cur = soakInterval{byKind: map[string]int64{}, latencies: make([]float64, 0, len(iv.latencies))}
	return iv
}

// totals returns the counts per kind so far.
func (t *soakTraffic) totals() (map[string]SoakCounts, map[string][]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]SoakCounts{}
	for k, c := range t.counts {
		out[k] = *c
	}
	ex := map[string][]string{}
	for k, v := range t.examples {
		ex[k] = slices.Clone(v)
	}
	return out, ex
}

// Answer verdicts of one call.
const (
	verdictOK = iota
	verdictError
	verdictWrong
)

func (t *soakTraffic) record(kind string, took time.Duration, verdict int, why string) {
	t.n.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cur.calls++
	t.cur.byKind[kind]++
	if verdict != verdictError {
		// Latency of answers: an error (a refused connection during a
		// kill) says nothing of the service's speed.
		t.cur.latencies = append(t.cur.latencies, float64(took)/float64(time.Millisecond))
	}
	c := t.counts[kind]
	c.Calls++
	switch verdict {
	case verdictOK:
		c.OK++
	case verdictError:
		c.Errors++
		t.cur.errors++
	default:
		c.Wrong++
		t.cur.wrong++
		if len(t.examples[kind]) < 5 {
			t.examples[kind] = append(t.examples[kind], why)
		}
	}
}

// run runs clients until ctx ends.
func (t *soakTraffic) run(ctx context.Context, clients int) {
	var wg sync.WaitGroup
	for i := range clients {
		tr := &http.Transport{
			DialContext:         (&net.Dialer{Timeout: t.timeout}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
			TLSClientConfig:     t.tls,
		}
		c := &soakClient{t: t, id: i, tenant: t.tenants[i%len(t.tenants)],
			rng:  rand.New(rand.NewPCG(t.seed, uint64(i)+1)),
			http: &http.Client{Transport: tr, Timeout: t.timeout}}
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for ctx.Err() == nil {
				if !c.one(ctx) {
					// Back off after an error, as a client would, instead
					// of spinning on a node that fails fast.
					_ = sleepUntil(ctx, time.Now().Add(time.Duration(50+c.rng.IntN(100))*time.Millisecond))
				}
			}
		})
	}
	wg.Wait()
}

// soakClient is one closed-loop client.
type soakClient struct {
	t       *soakTraffic
	id      int
	tenant  string
	rng     *rand.Rand
	http    *http.Client
	n       int
	paid    []soakAnswered // recent answered payments (a ring)
	sidecar []soakAnswered // recent answered transfers
}

func (c *soakClient) pickKind() string {
	total := 0
	for _, m := range soakMix {
		if m.kind == SoakSidecar || m.kind == SoakSidecarReplay {
			if !c.t.sidecar {
				continue
			}
		}
		total += m.weight
	}
	x := c.rng.IntN(total)
	for _, m := range soakMix {
		if !c.t.sidecar && (m.kind == SoakSidecar || m.kind == SoakSidecarReplay) {
			continue
		}
		if x < m.weight {
			return m.kind
		}
		x -= m.weight
	}
	return SoakFresh
}

func remember(ring []soakAnswered, a soakAnswered) []soakAnswered {
	if len(ring) < soakRecentKeys {
		return append(ring, a)
	}
	copy(ring, ring[1:])
	ring[len(ring)-1] = a
	return ring
}

// node picks a random node of region.
func (c *soakClient) node(region string) target {
	ns := c.t.targets[region]
	return ns[c.rng.IntN(len(ns))]
}

// away picks a region other than the tenant's home.
func (c *soakClient) away() string {
	home := c.t.homes[c.tenant]
	var others []string
	for _, r := range c.t.regions {
		if r != home {
			others = append(others, r)
		}
	}
	if len(others) == 0 {
		return home
	}
	return others[c.rng.IntN(len(others))]
}

func (c *soakClient) anyRegion() string { return c.t.regions[c.rng.IntN(len(c.t.regions))] }

func (c *soakClient) home() string {
	if h := c.t.homes[c.tenant]; h != "" {
		return h
	}
	return c.anyRegion()
}

// one sends one call of a random kind and reports whether it got an
// answer (not an error).
func (c *soakClient) one(ctx context.Context) bool {
	kind := c.pickKind()
	switch {
	case (kind == SoakReplay || kind == SoakConflict) && len(c.paid) == 0:
		kind = SoakFresh
	case kind == SoakSidecarReplay && len(c.sidecar) == 0:
		kind = SoakSidecar
	}
	switch kind {
	case SoakFresh, SoakForwarded:
		c.n++
		cmd := Command{
			AccountID:         fmt.Sprintf("acc_%d", c.id),
			AmountMinor:       int64(100 + c.rng.IntN(99900)),
			Currency:          currencies[c.rng.IntN(len(currencies))],
			MerchantReference: fmt.Sprintf("%s-ref-c%d-%d", c.t.runID, c.id, c.n),
			Channel:           channels[c.rng.IntN(len(channels))],
		}
		key := fmt.Sprintf("%s-c%d-%d", c.t.runID, c.id, c.n)
		region := c.home()
		if kind == SoakForwarded {
			region = c.away()
		}
		a, took, err := c.post(ctx, c.node(region).url+"/payments", key, cmd.Serialise(c.rng.IntN(1000), c.rng))
		v, why := judgeFresh(a, err)
		if ctx.Err() != nil && v == verdictError {
			return false // the soak ended mid-call
		}
		c.t.record(kind, took, v, why)
		if v == verdictOK {
			c.paid = remember(c.paid, soakAnswered{tenant: c.tenant, key: key, cmd: cmd, hash: answerHash(a.status, a.body)})
		}
		return v != verdictError
	case SoakReplay, SoakConflict:
		prev := c.paid[c.rng.IntN(len(c.paid))]
		cmd := prev.cmd
		if kind == SoakConflict {
			cmd.AmountMinor += int64(1 + c.rng.IntN(500))
		}
		a, took, err := c.post(ctx, c.node(c.anyRegion()).url+"/payments", prev.key, cmd.Serialise(1+c.rng.IntN(1000), c.rng))
		var v int
		var why string
		if kind == SoakReplay {
			v, why = judgeReplay(a, err, prev.hash)
		} else {
			v, why = judgeConflict(a, err)
		}
		if ctx.Err() != nil && v == verdictError {
			return false
		}
		c.t.record(kind, took, v, why)
		return v != verdictError
	case SoakSidecar:
		c.n++
		key := fmt.Sprintf("%s-c%d-t%d", c.t.runID, c.id, c.n)
		body := fmt.Appendf(nil, `{"amount":"%d.%02d","to":"acc_%d","memo":"soak %d"}`, 1+c.rng.IntN(999), c.rng.IntN(100), c.rng.IntN(50), c.n)
		a, took, err := c.post(ctx, c.node(c.anyRegion()).url+"/transfers", key, body)
		v, why := judgeFresh(a, err)
		if ctx.Err() != nil && v == verdictError {
			return false
		}
		c.t.record(kind, took, v, why)
		if v == verdictOK {
			c.sidecar = remember(c.sidecar, soakAnswered{tenant: c.tenant, key: key, body: body, hash: answerHash(a.status, a.body)})
		}
		return v != verdictError
	case SoakSidecarReplay:
		prev := c.sidecar[c.rng.IntN(len(c.sidecar))]
		a, took, err := c.post(ctx, c.node(c.anyRegion()).url+"/transfers", prev.key, prev.body)
		v, why := judgeReplay(a, err, prev.hash)
		if ctx.Err() != nil && v == verdictError {
			return false
		}
		c.t.record(kind, took, v, why)
		return v != verdictError
	}
	return false
}

// soakAnswer is one call's answer.
type soakAnswer struct {
	status   int
	body     []byte
	replayed bool
	code     string
}

func (c *soakClient) post(ctx context.Context, url, key string, body []byte) (soakAnswer, time.Duration, error) {
	var a soakAnswer
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return a, 0, err
	}
	req.GetBody = nil // never resent by net/http on its own
	req.Header.Set("Authorization", "Bearer "+c.t.tokens[c.tenant])
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return a, time.Since(start), err
	}
	a.body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return a, took, fmt.Errorf("reading the answer: %w", err)
	}
	a.status = resp.StatusCode
	a.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	var fields struct {
		ErrorCode string `json:"errorCode"`
	}
	if json.Unmarshal(a.body, &fields) == nil {
		a.code = fields.ErrorCode
	}
	return a, took, nil
}

// transient reports whether an answer is one a fault may cause and a real
// client retries: no answer, a 5xx, 409 in progress, 202 outcome unknown,
// 429.
func transient(a soakAnswer, err error) bool {
	if err != nil {
		return true
	}
	return a.status >= 500 || a.status == http.StatusTooManyRequests || a.status == http.StatusAccepted ||
		(a.status == http.StatusConflict && a.code == codeInProgress)
}

func describe(a soakAnswer) string {
	b := a.body
	if len(b) > 200 {
		b = b[:200]
	}
	return fmt.Sprintf("%d replayed=%t %s", a.status, a.replayed, b)
}

// judgeFresh judges the answer to a new key: 201, not marked replayed.
func judgeFresh(a soakAnswer, err error) (int, string) {
	switch {
	case transient(a, err):
		return verdictError, ""
	case a.status == http.StatusCreated && !a.replayed:
		return verdictOK, ""
	}
	return verdictWrong, "new key answered " + describe(a)
}

// judgeReplay judges a resent command: the first answer, byte for byte,
// marked replayed.
func judgeReplay(a soakAnswer, err error, first string) (int, string) {
	switch {
	case transient(a, err):
		return verdictError, ""
	case a.replayed && answerHash(a.status, a.body) == first:
		return verdictOK, ""
	}
	return verdictWrong, "replay answered " + describe(a)
}

// judgeConflict judges a key reused with another command: refused.
func judgeConflict(a soakAnswer, err error) (int, string) {
	switch {
	case transient(a, err):
		return verdictError, ""
	case a.status == http.StatusConflict && a.code == codeKeyReused:
		return verdictOK, ""
	}
	return verdictWrong, "reused key answered " + describe(a)
}

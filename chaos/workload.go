package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// WorkloadConfig shapes the traffic of a run.
type WorkloadConfig struct {
	// Clients is how many concurrent clients send requests.
	Clients int
	// Mix weights the roles of new operations; a missing role is never
	// chosen. Default: RoleNormal only.
	Mix map[Role]int
	// Timeout bounds one HTTP call. Default 2s.
	Timeout time.Duration
	// TLS is the clients' TLS configuration for a cluster with TLS (the
	// cluster's ClientTLS). Default nil: plain HTTP.
	TLS *tls.Config
	// MaxAttempts bounds the calls of one command with one key. Default 10.
	MaxAttempts int
	// Think is the mean pause of a client between operations. Default 20ms.
	Think time.Duration
	// Replays is the probability that a client resends a command that got
	// a final answer (once or twice, re-serialised, to another region),
	// which must be a replay. Default 0.
	Replays float64
	// RaceWidth is how many regions a RoleRacer's first attempt goes to at
	// once. Default 2.
	RaceWidth int
	// RaceSameRegion sends a RoleRacer's concurrent first attempts to
	// different nodes of one region instead of to different regions.
	RaceSameRegion bool
	// Away sends every first attempt to a region that is not the tenant's
	// home, so that it is forwarded (a service hop).
	Away bool
	// ReplayWindow is the nodes' --replay-window, for RoleExpiry.
	ReplayWindow time.Duration
	// NoKeyDelay, when set, makes a RoleNoKey client resend its command
	// with fresh keys after a random delay up to NoKeyDelay instead of at
	// once.
	NoKeyDelay time.Duration
	// GiveUpAfter, when set, stops the retries of a command this long
	// after its first call: with a short replay window, a retry must not
	// land after the window and become a new operation by accident.
	GiveUpAfter time.Duration
}

func (w *WorkloadConfig) setDefaults() {
	if w.Clients <= 0 {
		w.Clients = 6
	}
	if len(w.Mix) == 0 {
		w.Mix = map[Role]int{RoleNormal: 1}
	}
	if w.Timeout <= 0 {
		w.Timeout = 2 * time.Second
	}
	if w.MaxAttempts <= 0 {
		w.MaxAttempts = 10
	}
	if w.Think <= 0 {
		w.Think = 20 * time.Millisecond
	}
	if w.RaceWidth <= 0 {
		w.RaceWidth = 2
	}
}

// target is one node a client may send to.
type target struct {
	region, node, url string
}

// workload runs the clients of a run and records their calls.
type workload struct {
	cfg     WorkloadConfig
	seed    uint64
	runID   string
	regions []string            // region names, in order
	targets map[string][]target // region -> its nodes
	tenants []string
	tokens  map[string]string
	homes   map[string]string // tenant -> home region at the start
	hist    *History
	start   time.Time
	// pending tracks delayed retries (RoleExpiry), which run beside the
	// clients.
	pending sync.WaitGroup

	ops, errs atomic.Int64
}

func newWorkload(cfg WorkloadConfig, seed uint64, runID string, regions []string, targets map[string][]target, tokens, homes map[string]string, hist *History, start time.Time) *workload {
	cfg.setDefaults()
	tenants := make([]string, 0, len(tokens))
	for t := range tokens {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	return &workload{cfg: cfg, seed: seed, runID: runID, regions: regions, targets: targets,
		tenants: tenants, tokens: tokens, homes: homes, hist: hist, start: start}
}

// client is one concurrent client: its own random source and HTTP client.
type client struct {
	w      *workload
	id     int
	tenant string
	rng    *rand.Rand
	http   *http.Client
	mu     sync.Mutex // guards rng (a racer's lanes share it)
	n      int        // operations started
}

func (c *client) intN(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.IntN(n)
}

func (c *client) float() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64()
}

// subRand returns a new random source drawn from the client's.
func (c *client) subRand() *rand.Rand {
	c.mu.Lock()
	defer c.mu.Unlock()
	return rand.New(rand.NewPCG(c.rng.Uint64(), c.rng.Uint64()))
}

// run runs every client until traffic ends (no new operations) and lets
// open operations retry until drain ends.
func (w *workload) run(traffic, drain context.Context) {
	var wg sync.WaitGroup
	for i := range w.cfg.Clients {
		tr := &http.Transport{
			DialContext:         (&net.Dialer{Timeout: w.cfg.Timeout}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     5 * time.Second,
			TLSClientConfig:     w.cfg.TLS,
		}
		c := &client{
			w: w, id: i, tenant: w.tenants[i%len(w.tenants)],
			rng:  rand.New(rand.NewPCG(w.seed, uint64(i)+1)),
			http: &http.Client{Transport: tr, Timeout: w.cfg.Timeout},
		}
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			c.loop(traffic, drain)
		})
	}
	wg.Wait()
	w.pending.Wait()
}

func (c *client) loop(traffic, drain context.Context) {
	for traffic.Err() == nil {
		c.operation(traffic, drain)
		think := time.Duration(c.float() * 2 * float64(c.w.cfg.Think))
		select {
		case <-traffic.Done():
		case <-time.After(think):
		}
	}
}

// pickRole draws a role by the mix's weights.
func (c *client) pickRole() Role {
	roles := make([]Role, 0, len(c.w.cfg.Mix))
	total := 0
	for r, n := range c.w.cfg.Mix {
		if n > 0 {
			roles = append(roles, r)
			total += n
		}
	}
	slices.Sort(roles)
	x := c.intN(total)
	for _, r := range roles {
		if x < c.w.cfg.Mix[r] {
			return r
		}
		x -= c.w.cfg.Mix[r]
	}
	return RoleNormal
}

var (
	currencies = []string{"EUR", "USD", "GBP"}
	channels   = []string{"web", "web", "web", "mobile", "api", "pos"}
)

// newCommand makes a fresh command with its own merchant reference.
func (c *client) newCommand(n int) Command {
	return Command{
		AccountID:         fmt.Sprintf("acc_%d", c.id),
		AmountMinor:       int64(100 + c.intN(99900)),
		Currency:          currencies[c.intN(len(currencies))],
		MerchantReference: fmt.Sprintf("%s-ref-c%d-%d", c.w.runID, c.id, n),
		Channel:           channels[c.intN(len(channels))],
	}
}

// operation runs one operation of a random role.
func (c *client) operation(traffic, drain context.Context) {
	c.n++
	n := c.n
	role := c.pickRole()
	key := fmt.Sprintf("%s-c%d-%d", c.w.runID, c.id, n)
	cmd := c.newCommand(n)
	switch role {
	case RoleReuser:
		last := c.execute(drain, role, key, cmd, 0, false, "")
		if last == nil || last.Class() != ClassFinal {
			return
		}
		other := cmd
		other.AmountMinor += int64(1 + c.intN(500))
		c.execute(drain, role, key, other, 0, true, last.Region)
	case RoleNoKey:
		last := c.execute(drain, role, key, cmd, 0, false, "")
		if last == nil || last.Class() != ClassFinal {
			return
		}
		resend := func() {
			for i := 2; i <= 3 && last != nil && last.Class() == ClassFinal && traffic.Err() == nil; i++ {
				last = c.execute(drain, role, fmt.Sprintf("%s-dup%d", key, i), cmd, 0, false, last.Region)
			}
		}
		if c.w.cfg.NoKeyDelay <= 0 {
			resend()
			return
		}
		// Resubmit later, as a user who saw no confirmation would, without
		// holding the client up meanwhile.
		wait := time.Duration(c.float() * float64(c.w.cfg.NoKeyDelay))
		c.w.pending.Go(func() {
			select {
			case <-traffic.Done():
				return
			case <-time.After(wait):
			}
			resend()
		})
	case RoleExpiry:
		last := c.execute(drain, role, key, cmd, 0, false, "")
		if last == nil || last.Class() != ClassFinal || c.w.cfg.ReplayWindow <= 0 {
			return
		}
		// Retry once the record has surely expired (the store's clock
		// starts the window at the claim, before the answer), without
		// holding the client up meanwhile.
		wait := time.Until(c.w.start.Add(last.End)) + c.w.cfg.ReplayWindow + 1500*time.Millisecond
		c.w.pending.Go(func() {
			select {
			case <-drain.Done():
				return
			case <-time.After(wait):
			}
			c.execute(drain, role, key, cmd, 1, false, last.Region)
		})
	default:
		last := c.execute(drain, role, key, cmd, 0, false, "")
		if last != nil && last.Class() == ClassFinal && c.w.cfg.Replays > 0 && c.float() < c.w.cfg.Replays {
			for range 1 + c.intN(2) {
				if traffic.Err() != nil {
					break
				}
				last = c.execute(drain, RoleNormal, key, cmd, 0, false, last.Region)
			}
		}
	}
}

// execute sends cmd with key until a definite answer (final, conflict or
// rejected), at most MaxAttempts times, each retry to a different region
// than the previous call and re-serialised differently. A RoleRacer's first
// attempt goes to several regions at once. avoid names a region the first
// call should not go to. It returns the last op.
func (c *client) execute(ctx context.Context, role Role, key string, cmd Command, epoch int, reused bool, avoid string) *Op {
	rng := c.subRand()
	sent := map[string]bool{}
	body := func() []byte {
		var b []byte
		for range 8 {
			b = cmd.Serialise(1+rng.IntN(1000), rng)
			if !sent[string(b)] {
				break
			}
		}
		sent[string(b)] = true
		return b
	}
	if avoid == "" && c.w.cfg.Away {
		avoid = c.w.homes[c.tenant]
	}
	region := c.otherRegion(avoid, rng)
	var last *Op
	first := time.Now()
	for attempt := 1; attempt <= c.w.cfg.MaxAttempts; attempt++ {
		if ctx.Err() != nil || (attempt > 1 && c.w.cfg.GiveUpAfter > 0 && time.Since(first) > c.w.cfg.GiveUpAfter) {
			return last
		}
		if role == RoleRacer && attempt == 1 {
			last = c.race(ctx, role, key, cmd, epoch, region, rng, body)
		} else {
			last = c.call(ctx, 0, role, key, cmd, epoch, reused, attempt, region, rng, body())
		}
		switch last.Class() {
		case ClassFinal, ClassConflict, ClassRejected:
			return last
		}
		region = c.otherRegion(last.Region, rng)
		backoff := min(time.Duration(50<<min(attempt-1, 5))*time.Millisecond, time.Second)
		if ra := last.retryAfter; ra > 0 {
			backoff = min(ra, time.Second)
		}
		backoff += time.Duration(rng.IntN(50)) * time.Millisecond
		select {
		case <-ctx.Done():
			return last
		case <-time.After(backoff):
		}
	}
	return last
}

// race sends the first attempt to RaceWidth regions at once and returns a
// final op if any got one.
func (c *client) race(ctx context.Context, role Role, key string, cmd Command, epoch int, first string, rng *rand.Rand, body func() []byte) *Op {
	regions := slices.Clone(c.w.regions)
	rng.Shuffle(len(regions), func(i, j int) { regions[i], regions[j] = regions[j], regions[i] })
	width := max(min(c.w.cfg.RaceWidth, len(regions)), 2)
	if c.w.cfg.RaceSameRegion {
		width = max(c.w.cfg.RaceWidth, 2)
		regions = []string{first}
	}
	ops := make([]*Op, width)
	bodies := make([][]byte, width)
	for i := range bodies {
		bodies[i] = body()
	}
	var wg sync.WaitGroup
	for i := range width {
		s := callSpec{client: c.id, lane: i + 1, role: role, tenant: c.tenant, key: key, cmd: cmd, epoch: epoch, attempt: 1,
			region: regions[i%len(regions)], node: -1}
		if c.w.cfg.RaceSameRegion {
			s.node = i
		}
		lr := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		wg.Go(func() { ops[i] = c.w.call(ctx, c.http, s, lr, bodies[i]) })
	}
	wg.Wait()
	for _, o := range ops {
		if o.Class() == ClassFinal {
			return o
		}
	}
	return ops[0]
}

// otherRegion picks a region other than avoid (when there is one).
func (c *client) otherRegion(avoid string, rng *rand.Rand) string {
	var choices []string
	for _, r := range c.w.regions {
		if r != avoid {
			choices = append(choices, r)
		}
	}
	if len(choices) == 0 {
		choices = c.w.regions
	}
	return choices[rng.IntN(len(choices))]
}

// callSpec describes one call.
type callSpec struct {
	client, lane int
	role         Role
	tenant, key  string
	cmd          Command
	epoch        int
	reused       bool
	sweep        bool
	attempt      int
	region       string
	node         int // index of the node in the region (modulo); -1: random
}

// call sends one POST /payments to a random node of region and records it.
func (c *client) call(ctx context.Context, lane int, role Role, key string, cmd Command, epoch int, reused bool, attempt int, region string, rng *rand.Rand, body []byte) *Op {
	return c.w.call(ctx, c.http, callSpec{client: c.id, lane: lane, role: role, tenant: c.tenant, key: key, cmd: cmd,
		epoch: epoch, reused: reused, attempt: attempt, region: region, node: -1}, rng, body)
}

// call sends one POST /payments as s says, to a random node of s.region,
// and records it. A node that refuses the connection (a dead process) got
// nothing, so the call goes on to the next endpoint, as a client with
// several endpoints (an SDK's list, DNS, a global load balancer) does:
// the region's other nodes first, then the other regions' in a random
// order. Such a call is recorded once, where it was answered, with the
// node it was meant for in RedirectedFrom.
func (w *workload) call(ctx context.Context, hc *http.Client, s callSpec, rng *rand.Rand, body []byte) *Op {
	nodes := w.targets[s.region]
	t := nodes[rng.IntN(len(nodes))]
	if s.node >= 0 {
		t = nodes[s.node%len(nodes)]
	}
	op := &Op{
		Client: s.client, Lane: s.lane, Role: s.role, Tenant: s.tenant, Key: s.key, Epoch: s.epoch, Attempt: s.attempt,
		Region: t.region, Node: t.node, Command: s.cmd, CommandID: s.cmd.ID(), Reused: s.reused, Sweep: s.sweep, Body: string(body),
	}
	op.Start = time.Since(w.start)
	var resp *http.Response
	var err error
	for _, next := range w.endpoints(t, rng) {
		if next != t {
			op.RedirectedFrom, op.Region, op.Node = t.node, next.region, next.node
		}
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, next.url+"/payments", bytes.NewReader(body))
		if err != nil {
			op.End = time.Since(w.start)
			op.Err = err.Error()
			w.record(op)
			return op
		}
		// net/http may resend a request carrying an Idempotency-Key on its
		// own after a broken keep-alive connection; every call must be
		// recorded, so it must not.
		req.GetBody = nil
		req.Header.Set("Authorization", "Bearer "+w.tokens[s.tenant])
		req.Header.Set("Idempotency-Key", s.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err = hc.Do(req)
		if err == nil || !refused(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		op.End = time.Since(w.start)
		op.Err = err.Error()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			op.Err = errTimeout
		}
		w.record(op)
		return op
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	op.End = time.Since(w.start)
	if err != nil {
		// The status line arrived but not the whole body: still no answer.
		op.Err = "reading the answer: " + err.Error()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			op.Err = errTimeout
		}
		w.record(op)
		return op
	}
	op.Status = resp.StatusCode
	op.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	op.RespBody = string(raw)
	op.RespHash = answerHash(resp.StatusCode, raw)
	var fields struct {
		ErrorCode         string `json:"errorCode"`
		PaymentID         string `json:"paymentId"`
		ID                string `json:"id"`
		ExistingPaymentID string `json:"existingPaymentId"`
	}
	if json.Unmarshal(raw, &fields) == nil {
		op.ErrorCode = fields.ErrorCode
		op.PaymentID = firstNonEmpty(fields.PaymentID, fields.ID, fields.ExistingPaymentID)
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		op.retryAfter = time.Duration(secs) * time.Second
	}
	w.record(op)
	return op
}

// endpoints lists where a call meant for t may go, in order: t, the other
// nodes of its region, then the other regions' nodes, each region's in a
// random order.
func (w *workload) endpoints(t target, rng *rand.Rand) []target {
	out := []target{t}
	add := func(nodes []target) {
		for _, i := range rng.Perm(len(nodes)) {
			if nodes[i] != t {
				out = append(out, nodes[i])
			}
		}
	}
	add(w.targets[t.region])
	for _, i := range rng.Perm(len(w.regions)) {
		if r := w.regions[i]; r != t.region {
			add(w.targets[r])
		}
	}
	return out
}

// refused reports whether err is a connection that could not be opened:
// the request was never sent, so sending it elsewhere is not a retry.
func refused(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// record adds op to the history and the progress counters.
func (w *workload) record(op *Op) {
	w.hist.add(op)
	w.ops.Add(1)
	if c := op.Class(); c == ClassAmbiguous || c == ClassRejected {
		w.errs.Add(1)
	}
}

// sweep resends, once, every command that got a final answer, re-serialised
// and to a random region, after the faults have healed: each must replay
// its first answer. Keys of RoleExpiry are left out (their window is short
// on purpose).
func (w *workload) sweep(ctx context.Context) {
	seen := map[string]bool{}
	var todo []*Op
	for _, o := range w.hist.Ops() {
		if o.Class() != ClassFinal || o.Role == RoleExpiry || o.Reused || seen[o.partitionKey()] {
			continue
		}
		seen[o.partitionKey()] = true
		todo = append(todo, o)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for i := range w.cfg.Clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 4, TLSClientConfig: w.cfg.TLS}
		hc := &http.Client{Transport: tr, Timeout: w.cfg.Timeout}
		rng := rand.New(rand.NewPCG(w.seed^0x5eed, uint64(i)+1))
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for ctx.Err() == nil {
				j := int(next.Add(1)) - 1
				if j >= len(todo) {
					return
				}
				o := todo[j]
				s := callSpec{client: o.Client, lane: 7, role: o.Role, tenant: o.Tenant, key: o.Key, cmd: o.Command,
					epoch: o.Epoch, sweep: true, attempt: o.Attempt + 1, region: w.regions[rng.IntN(len(w.regions))], node: -1}
				w.call(ctx, hc, s, rng, o.Command.Serialise(1+rng.IntN(1000), rng))
			}
		})
	}
	wg.Wait()
}

package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/idemgrpc"
)

// Timings of the gRPC scenario's nodes.
const (
	// grpcNodeCount is how many gRPC nodes serve the service.
	grpcNodeCount = 2
	// grpcHold is how long a call is held after its side effect: most
	// calls a kill interrupts have acted and not answered.
	grpcHold = 150 * time.Millisecond
)

// grpcRetryConfig is the clients' service config: round robin over the
// nodes, and a retry policy for what the contract says a retry may
// answer (a lost answer or a node gone: UNAVAILABLE; the key's first call
// still running: ABORTED, with the server's pushback).
const grpcRetryConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [{"service": "` + grpcService + `"}],
    "retryPolicy": {
      "maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s", "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]
    }
  }]
}`

// grpcNodes are the gRPC scenario's node processes (idemctl grpc-node), on
// the first region's store, each on a fixed address so that a node
// restarted after a kill comes back where its clients look for it.
type grpcNodes struct {
	idemctl, dbURL, token, logDir string
	addrs                         []string

	mu    sync.Mutex
	procs []*exec.Cmd
	done  []chan struct{}
}

// startGRPCNodes creates the effects table and starts the nodes.
func startGRPCNodes(ctx context.Context, idemctl, dbURL, logDir string) (*grpcNodes, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: grpc nodes: %w", err)
	}
	_, err = conn.Exec(ctx, grpcEffectsDDL)
	_ = conn.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: grpc nodes: effects table: %w", err)
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: grpc nodes: %w", err)
	}
	g := &grpcNodes{idemctl: idemctl, dbURL: dbURL, token: fmt.Sprintf("grpc-%d", rand.Uint64()), logDir: logDir,
		procs: make([]*exec.Cmd, grpcNodeCount), done: make([]chan struct{}, grpcNodeCount)}
	for range grpcNodeCount {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("chaos: grpc nodes: %w", err)
		}
		g.addrs = append(g.addrs, ln.Addr().String())
		_ = ln.Close()
	}
	for i := range grpcNodeCount {
		if err := g.start(ctx, i); err != nil {
			g.stop()
			return nil, err
		}
	}
	return g, nil
}

// start runs node i and waits until it serves.
func (g *grpcNodes) start(ctx context.Context, i int) error {
	log, err := os.OpenFile(filepath.Join(g.logDir, fmt.Sprintf("grpc-node-%d.log", i)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: grpc node %d: %w", i, err)
	}
	cmd := exec.Command(g.idemctl, "grpc-node", "--listen", g.addrs[i], "--database-url", g.dbURL, "--name", fmt.Sprintf("grpc-node-%d", i),
		"--lock-timeout", chaosLockTimeout.String(), "--hold", grpcHold.String())
	cmd.Env = append(os.Environ(), grpcTokenEnv+"="+g.token)
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		_ = log.Close()
		return fmt.Errorf("chaos: grpc node %d: %w", i, err)
	}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("chaos: grpc node %d: %w", i, err)
	}
	done := make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			if first {
				first = false
				if strings.HasPrefix(sc.Text(), "listening on ") {
					ready <- nil
				} else {
					ready <- fmt.Errorf("chaos: grpc node %d printed %q", i, sc.Text())
				}
			}
			fmt.Fprintln(log, sc.Text())
		}
		if first {
			ready <- fmt.Errorf("chaos: grpc node %d exited before it served (see %s)", i, log.Name())
		}
		_ = cmd.Wait()
		_ = log.Close()
		close(done)
	}()
	g.mu.Lock()
	g.procs[i], g.done[i] = cmd, done
	g.mu.Unlock()
	select {
	case err := <-ready:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return fmt.Errorf("chaos: grpc node %d did not serve within 30s", i)
	}
}

// kill kills node i (SIGKILL) and waits until it is gone.
func (g *grpcNodes) kill(i int) error {
	g.mu.Lock()
	cmd, done := g.procs[i], g.done[i]
	g.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("chaos: grpc node %d is not running", i)
	}
	if err := cmd.Process.Kill(); err != nil {
		return fmt.Errorf("chaos: kill grpc node %d: %w", i, err)
	}
	<-done
	return nil
}

// stop ends every node (SIGTERM) and waits for them.
func (g *grpcNodes) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, cmd := range g.procs {
		if cmd == nil {
			continue
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done[i]:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-g.done[i]
		}
	}
}

type killGRPCNode struct {
	notes
	env *Env
	i   int
}

// KillGRPCNode kills gRPC node i of the gRPC scenario (SIGKILL) while its
// clients' calls are in flight, and restarts it at Heal.
func KillGRPCNode(env *Env, i int) Fault { return &killGRPCNode{env: env, i: i} }

func (f *killGRPCNode) Name() string                    { return fmt.Sprintf("kill-grpc-node(%d)", f.i) }
func (f *killGRPCNode) Available(*cluster.Cluster) bool { return f.env.grpc != nil }
func (f *killGRPCNode) Inject(_ context.Context, _ *cluster.Cluster) error {
	if t := f.env.grpcTraffic; t != nil {
		f.note("%d gRPC call(s) in flight when the node was killed", t.inflight.Load())
	}
	return f.env.grpc.kill(f.i)
}
func (f *killGRPCNode) Heal(ctx context.Context, _ *cluster.Cluster) error {
	return f.env.grpc.start(ctx, f.i)
}

// GRPCAnswer is one call of the gRPC scenario as its client saw it, after
// gRPC's own retries.
type GRPCAnswer struct {
	// Code is the gRPC code's name (OK for an answer).
	Code string `json:"code"`
	// ErrorCode is the contract's error code of an error (its ErrorInfo).
	ErrorCode string `json:"errorCode,omitempty"`
	Message   string `json:"message,omitempty"`
	// Transfer is an answer's transfer id.
	Transfer string `json:"transfer,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	// Sweep marks the replay sweep's resend.
	Sweep bool `json:"sweep,omitempty"`
}

func (a GRPCAnswer) ok() bool { return a.Code == "OK" }

// grpcKey is one command of the gRPC scenario and every answer it got.
type grpcKey struct {
	Key     string       `json:"key"`
	Amount  string       `json:"amount"`
	Answers []GRPCAnswer `json:"answers"`
	// Effects are the ids of the effect rows of the key (the result's).
	Effects []int64 `json:"effects,omitempty"`
}

// grpcTraffic drives Transfers/Create from clients with a retry policy,
// each on a connection of its own over every gRPC node.
type grpcTraffic struct {
	nodes *grpcNodes
	runID string
	seed  uint64

	inflight atomic.Int64
	mu       sync.Mutex
	keys     []*grpcKey
}

func newGRPCTraffic(nodes *grpcNodes, runID string, seed uint64) *grpcTraffic {
	return &grpcTraffic{nodes: nodes, runID: runID, seed: seed}
}

// dial returns a client over every node: round robin, the retry policy,
// and idemgrpc's client interceptor.
func (t *grpcTraffic) dial() (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("chaos-grpc")
	addrs := make([]resolver.Address, len(t.nodes.addrs))
	for i, a := range t.nodes.addrs {
		addrs[i] = resolver.Address{Addr: a}
	}
	r.InitialState(resolver.State{Addresses: addrs})
	return grpc.NewClient(r.Scheme()+":///grpc-nodes", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(grpcRetryConfig),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})))
}

// run sends commands from clients concurrent clients until traffic ends;
// open commands keep re-sending until drain ends.
func (t *grpcTraffic) run(traffic, drain context.Context, clients int) {
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			cc, err := t.dial()
			if err != nil {
				return
			}
			defer cc.Close()
			rng := rand.New(rand.NewPCG(t.seed, uint64(i)+2000))
			for n := 0; traffic.Err() == nil; n++ {
				k := &grpcKey{Key: fmt.Sprintf("%s-grpc%d-%d", t.runID, i, n), Amount: fmt.Sprintf("%d.00", 1+rng.IntN(500))}
				t.mu.Lock()
				t.keys = append(t.keys, k)
				t.mu.Unlock()
				t.drive(drain, cc, rng, k)
				sleepCtx(traffic, time.Duration(10+rng.IntN(40))*time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// drive sends k until it is answered, re-sending with the same key
// (idemgrpc.WithKey) what gRPC's retry policy gave up on.
func (t *grpcTraffic) drive(ctx context.Context, cc *grpc.ClientConn, rng *rand.Rand, k *grpcKey) {
	for attempt := 0; ctx.Err() == nil && attempt < 200; attempt++ {
		a := t.call(ctx, cc, k, false)
		if a.ok() || !retryableGRPC(a.Code) {
			return
		}
		sleepCtx(ctx, time.Duration(50+rng.IntN(150))*time.Millisecond)
	}
}

// retryableGRPC says which final codes a client re-sends with the same
// key: the contract's retryable ones, and a deadline of its own.
func retryableGRPC(code string) bool {
	return code == "UNAVAILABLE" || code == "ABORTED" || code == "DEADLINE_EXCEEDED"
}

// call sends k once (gRPC's retries included) and records the answer.
func (t *grpcTraffic) call(ctx context.Context, cc *grpc.ClientConn, k *grpcKey, sweep bool) GRPCAnswer {
	t.inflight.Add(1)
	defer t.inflight.Add(-1)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cctx = metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+t.nodes.token)
	cctx = idemgrpc.WithKey(cctx, k.Key)
	req, _ := structpb.NewStruct(map[string]any{"amount": k.Amount, "to": "acc_grpc"})
	resp := new(structpb.Struct)
	var header metadata.MD
	err := cc.Invoke(cctx, grpcMethod, req, resp, grpc.Header(&header))
	a := GRPCAnswer{Code: idemgrpc.CodeName(status.Code(err)), Sweep: sweep}
	if err != nil {
		a.ErrorCode = idemgrpc.ErrorCode(err)
		a.Message = firstLine(status.Convert(err).Message())
	} else {
		a.Transfer = resp.GetFields()["transferId"].GetStringValue()
		a.Replayed = slices.Equal(header.Get(idemgrpc.MetadataReplayed), []string{"true"})
	}
	t.mu.Lock()
	k.Answers = append(k.Answers, a)
	t.mu.Unlock()
	return a
}

// sweep resends every command once: it must be answered with a replay of
// its answer.
func (t *grpcTraffic) sweep(ctx context.Context) {
	cc, err := t.dial()
	if err != nil {
		return
	}
	defer cc.Close()
	t.mu.Lock()
	keys := slices.Clone(t.keys)
	t.mu.Unlock()
	for _, k := range keys {
		for range sweepAttempts {
			if a := t.call(ctx, cc, k, true); !retryableGRPC(a.Code) || ctx.Err() != nil {
				break
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
	}
}

// grpcResult is the gRPC scenario's traffic and the effect rows of its keys.
type grpcResult struct {
	keys []*grpcKey
	// stray are effect rows of keys no command has.
	stray map[string]int
}

// result reads the effect rows of the run's keys and joins them to the
// commands.
func (t *grpcTraffic) result(ctx context.Context) (*grpcResult, error) {
	conn, err := pgx.Connect(ctx, t.nodes.dbURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: grpc effects: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT idempotency_key, id FROM `+grpcEffectsTable+` WHERE idempotency_key LIKE $1 ORDER BY id`,
		escapeLike(t.runID+"-")+"%")
	if err != nil {
		return nil, fmt.Errorf("chaos: grpc effects: %w", err)
	}
	effects := map[string][]int64{}
	for rows.Next() {
		var (
			key string
			id  int64
		)
		if err := rows.Scan(&key, &id); err != nil {
			return nil, fmt.Errorf("chaos: grpc effects: %w", err)
		}
		effects[key] = append(effects[key], id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: grpc effects: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	res := &grpcResult{stray: map[string]int{}}
	known := map[string]bool{}
	for _, k := range t.keys {
		k.Effects = effects[k.Key]
		known[k.Key] = true
		res.keys = append(res.keys, k)
	}
	for key, ids := range effects {
		if !known[key] {
			res.stray[key] = len(ids)
		}
	}
	return res, nil
}

// checkGRPCSingleExecution: each command's side effect happened at most
// once, exactly once for a command answered, and its answer names it.
func checkGRPCSingleExecution(in *checkInput) CheckResult {
	r := newResult(CheckGRPCSingleExecution)
	g := in.grpc
	if g == nil {
		r.Skipped = true
		return r.done("not a gRPC scenario")
	}
	answered, recovered, executions := 0, 0, 0
	for _, k := range g.keys {
		executions += len(k.Effects)
		if len(k.Effects) > 1 {
			r.fail(CounterExample{Key: k.Key, Summary: fmt.Sprintf("executed %d times", len(k.Effects)), Rows: []any{k}})
		}
		i := slices.IndexFunc(k.Answers, GRPCAnswer.ok)
		if i < 0 {
			continue
		}
		answered++
		if !k.Answers[i].Sweep && k.Answers[i].Replayed {
			// The client's first answer was a replay: an earlier attempt
			// executed and its answer was lost (a node killed mid-call).
			recovered++
		}
		switch {
		case len(k.Effects) == 0:
			r.fail(CounterExample{Key: k.Key, Summary: "answered, but never executed", Rows: []any{k}})
		case k.Answers[i].Transfer != fmt.Sprintf("tr_%d", k.Effects[0]):
			r.fail(CounterExample{Key: k.Key, Summary: fmt.Sprintf("answered %s, but its execution was tr_%d", k.Answers[i].Transfer, k.Effects[0]), Rows: []any{k}})
		}
	}
	for key, n := range g.stray {
		r.fail(CounterExample{Key: key, Summary: fmt.Sprintf("%d execution(s) of a key no command has", n)})
	}
	if len(g.keys) == 0 {
		r.fail(CounterExample{Summary: "no gRPC traffic"})
	}
	return r.done("%d command(s), %d answered, %d first answered with a replay (an earlier attempt's answer lost); %d execution(s)",
		len(g.keys), answered, recovered, executions)
}

// checkGRPCAnswers: every command was answered (none lost), every answer
// of one command is the same transfer, the sweep's resend replayed it with
// idempotent-replayed, and no call was refused as a reused key or failed
// INTERNAL.
func checkGRPCAnswers(in *checkInput) CheckResult {
	r := newResult(CheckGRPCAnswers)
	g := in.grpc
	if g == nil {
		r.Skipped = true
		return r.done("not a gRPC scenario")
	}
	calls, replays := 0, 0
	for _, k := range g.keys {
		calls += len(k.Answers)
		first := ""
		swept := false
		for _, a := range k.Answers {
			switch {
			case a.ok() && first == "":
				first = a.Transfer
			case a.ok() && a.Transfer != first:
				r.fail(CounterExample{Key: k.Key, Summary: fmt.Sprintf("answered %s, then %s", first, a.Transfer), Rows: []any{k}})
			case a.ErrorCode == idem.ECodeKeyReused || a.Code == "INTERNAL" || a.Code == "UNKNOWN":
				r.fail(CounterExample{Key: k.Key, Summary: fmt.Sprintf("a call answered %s %s", a.Code, a.ErrorCode), Rows: []any{k}})
			}
			if a.ok() && a.Replayed {
				replays++
			}
			if a.Sweep {
				swept = true
				if !a.ok() || !a.Replayed {
					r.fail(CounterExample{Key: k.Key, Summary: fmt.Sprintf("the sweep's resend answered %s %s (replayed %v), not a replay", a.Code, a.ErrorCode, a.Replayed), Rows: []any{k}})
				}
			}
		}
		switch {
		case first == "":
			r.fail(CounterExample{Key: k.Key, Summary: "never answered (lost)", Rows: []any{k}})
		case !swept:
			r.fail(CounterExample{Key: k.Key, Summary: "not resent by the sweep", Rows: []any{k}})
		}
	}
	return r.done("%d command(s), %d call(s), %d replayed answer(s)", len(g.keys), calls, replays)
}

// errGRPCNoNodes reports a gRPC scenario run without idemctl's path.
var errGRPCNoNodes = errors.New("chaos: a gRPC scenario needs idemctl (Options.Idemctl) to run its nodes")

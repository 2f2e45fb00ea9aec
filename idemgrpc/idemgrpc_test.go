package idemgrpc_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/pgtest"
	"github.com/idemcoord/idem/memcoord"
)

func TestMain(m *testing.M) { os.Exit(pgtest.MainLeakChecked(m)) }

// A grpc-go client whose service config retries UNAVAILABLE, against a
// server whose transport drops the answers of each key's first two
// attempts after the handler ran: clients in parallel, some sharing keys,
// each get the key's first answer, and the handler ran once per key.
func TestRetriesAgainstDroppedAnswersExecuteOnce(t *testing.T) {
	svc := newTransfers()
	var (
		mu       sync.Mutex
		arrivals = map[string]int{}
		keysSeen = map[string]int{}
	)
	var srv *server
	dropper := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		key := strings.Join(md.Get(idemgrpc.MetadataKey), ",")
		mu.Lock()
		arrivals[key]++
		n := arrivals[key]
		keysSeen[key]++
		mu.Unlock()
		resp, err := handler(ctx, req)
		if n <= 2 {
			// The handler ran (and its answer is stored); the answer is
			// lost on the way back.
			srv.lis.drop(ctx)
		}
		return resp, err
	}
	srv = newServer(t, svc, idemgrpc.Options{Wait: 2 * time.Second}, dropper)

	const (
		clients       = 6
		keysPerClient = 4
	)
	type got struct {
		key  string
		resp *structpb.Struct
		err  error
	}
	results := make(chan got, clients*keysPerClient)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each client has its own connection, which a drop closes.
			cc := dial(t, srv.addr, true, true)
			for k := range keysPerClient {
				// Clients c and c+1 (c even) share their keys: two
				// clients racing with one key.
				key := fmt.Sprintf("key-%d-%d", c/2, k)
				ctx := callCtx(t, key)
				resp, _, _, err := create(ctx, cc, map[string]any{"from": "acc_" + key, "amount": "10.00"})
				results <- got{key, resp, err}
			}
		}()
	}
	wg.Wait()
	close(results)
	n := 0
	for g := range results {
		n++
		if g.err != nil {
			t.Errorf("key %s: %v", g.key, g.err)
			continue
		}
		if first := svc.firstAnswer(g.key); !proto.Equal(g.resp, first) {
			t.Errorf("key %s: answer %v, want the first answer %v", g.key, g.resp, first)
		}
	}
	if n != clients*keysPerClient {
		t.Fatalf("%d answers, want %d", n, clients*keysPerClient)
	}
	for c := 0; c < clients; c += 2 {
		for k := range keysPerClient {
			key := fmt.Sprintf("key-%d-%d", c/2, k)
			if e := svc.executions(key); e != 1 {
				t.Errorf("key %s executed %d times, want once", key, e)
			}
			mu.Lock()
			a := arrivals[key]
			mu.Unlock()
			if a < 3 {
				t.Errorf("key %s: %d attempts reached the server, want at least 3 (two answers dropped)", key, a)
			}
		}
	}
	if len(keysSeen) != clients/2*keysPerClient {
		t.Errorf("the server saw %d keys, want %d: a retry came with another key", len(keysSeen), clients/2*keysPerClient)
	}
}

// A reused key with another request answers FAILED_PRECONDITION
// IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST, without executing; the
// same message with its fields given in another order is the same
// command.
func TestReusedKeyWithAnotherRequest(t *testing.T) {
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)
	first, _, _, err := create(callCtx(t, "k1"), cc, map[string]any{"from": "acc_1", "amount": "10.00"})
	if err != nil {
		t.Fatal(err)
	}
	again, header, _, err := create(callCtx(t, "k1"), cc, map[string]any{"amount": "10.00", "from": "acc_1"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(again, first) || header.Get(idemgrpc.MetadataReplayed) == nil {
		t.Fatalf("the same command: %v (header %v), want a replay of %v", again, header, first)
	}
	_, header, _, err = create(callCtx(t, "k1"), cc, map[string]any{"from": "acc_1", "amount": "99.00"})
	wantCode(t, err, codes.FailedPrecondition, idem.ECodeKeyReused)
	if len(header.Get(idemgrpc.MetadataReplayed)) > 0 {
		t.Errorf("a conflict carries %s", idemgrpc.MetadataReplayed)
	}
	st, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetDomain() != idemgrpc.ErrorDomain || info.GetReason() != idem.ECodeKeyReused {
		t.Errorf("ErrorInfo = %v, want reason %s in domain %s", info, idem.ECodeKeyReused, idemgrpc.ErrorDomain)
	}
	if n := svc.execs.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// A replay carries idempotent-replayed: true in its header metadata, the
// stored trailers, and the first answer; the first answer carries no
// replay marker. Both carry the window.
func TestReplayCarriesMetadata(t *testing.T) {
	svc := newTransfers()
	svc.fn = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-request-region", "eu"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger-entry", "le_7", "x-sig-bin", "\x00\xff"))
		return structpb.NewStruct(map[string]any{"transferId": "tr_1"})
	}
	srv := newServer(t, svc, idemgrpc.Options{ReplayTrailers: []string{"X-Ledger-Entry", "x-sig-bin"}, ReplayHeaders: []string{"x-request-region"}})
	cc := dial(t, srv.addr, false, false)
	var answers []*structpb.Struct
	for i := range 2 {
		resp, header, trailer, err := create(callCtx(t, "k-meta"), cc, map[string]any{"from": "acc_1"})
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, resp)
		replayed := header.Get(idemgrpc.MetadataReplayed)
		switch {
		case i == 0 && len(replayed) > 0:
			t.Errorf("first answer: %s = %q", idemgrpc.MetadataReplayed, replayed)
		case i == 1 && (len(replayed) != 1 || replayed[0] != "true"):
			t.Errorf("replay: %s = %q, want true", idemgrpc.MetadataReplayed, replayed)
		}
		if got := header.Get("x-request-region"); len(got) != 1 || got[0] != "eu" {
			t.Errorf("answer %d: header x-request-region = %q", i, got)
		}
		if got := trailer.Get("x-ledger-entry"); len(got) != 1 || got[0] != "le_7" {
			t.Errorf("answer %d: trailer x-ledger-entry = %q", i, got)
		}
		if got := trailer.Get("x-sig-bin"); len(got) != 1 || got[0] != "\x00\xff" {
			t.Errorf("answer %d: trailer x-sig-bin = %q", i, got)
		}
		if got := trailer.Get(idemgrpc.MetadataWindow); len(got) != 1 || got[0] != "86400" {
			t.Errorf("answer %d: trailer %s = %q, want 86400", i, idemgrpc.MetadataWindow, got)
		}
	}
	if !proto.Equal(answers[0], answers[1]) {
		t.Errorf("replay %v, want %v", answers[1], answers[0])
	}
	if n := svc.execs.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// Without a key, with a bad key, or without a credential the handler does
// not run and the call answers the contract's code.
func TestRefusedBeforeTheEngine(t *testing.T) {
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)
	_, _, _, err := create(callCtx(t, ""), cc, map[string]any{})
	wantCode(t, err, codes.InvalidArgument, idem.ECodeKeyMissing)
	for _, bad := range []string{"has space", strings.Repeat("k", 256), `"unterminated`} {
		_, _, _, err = create(callCtx(t, bad), cc, map[string]any{})
		wantCode(t, err, codes.InvalidArgument, idem.ECodeKeyInvalid)
	}
	ctx := metadata.AppendToOutgoingContext(callCtx(t, "k"), idemgrpc.MetadataKey, "k2")
	_, _, _, err = create(ctx, cc, map[string]any{})
	wantCode(t, err, codes.InvalidArgument, idem.ECodeKeyInvalid)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, _, err = create(idemgrpc.WithKey(ctx, "k"), cc, map[string]any{})
	wantCode(t, err, codes.Unauthenticated, idem.ECodeUnauthenticated)
	// The sf-string form is the bare key.
	if _, _, _, err := create(callCtx(t, `"k-sf"`), cc, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	_, header, _, err := create(callCtx(t, "k-sf"), cc, map[string]any{})
	if err != nil || len(header.Get(idemgrpc.MetadataReplayed)) == 0 {
		t.Fatalf("bare form of an sf-string key: %v, header %v; want a replay", err, header)
	}
	if n := svc.execs.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// A key in progress answers ABORTED IDEMPOTENCY_REQUEST_IN_PROGRESS, with a
// RetryInfo detail and the retry pushback, in a trailers-only answer.
func TestInProgress(t *testing.T) {
	svc := newTransfers()
	entered, release := make(chan struct{}), make(chan struct{})
	svc.fn = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		close(entered)
		<-release
		return &structpb.Struct{}, nil
	}
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)
	firstDone := make(chan error, 1)
	go func() {
		_, _, _, err := create(callCtx(t, "k-busy"), cc, map[string]any{})
		firstDone <- err
	}()
	<-entered
	_, header, trailer, err := create(callCtx(t, "k-busy"), cc, map[string]any{})
	close(release)
	wantCode(t, err, codes.Aborted, idem.ECodeInProgress)
	if len(header) > 0 {
		t.Errorf("header metadata %v: a retry policy retries only trailers-only answers", header)
	}
	if got := trailer.Get(idemgrpc.PushbackTrailer); len(got) != 1 || got[0] != "1000" {
		t.Errorf("trailer %s = %q, want 1000", idemgrpc.PushbackTrailer, got)
	}
	st, _ := status.FromError(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() != time.Second {
		t.Errorf("RetryInfo = %v, want a delay of 1s", retry)
	}
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
}

// A client that hangs up does not cancel the handler: it finishes, its
// answer is stored, and the retry gets it without a second execution.
func TestClientHangUpDoesNotCancelTheHandler(t *testing.T) {
	svc := newTransfers()
	entered, hungUp := make(chan struct{}), make(chan struct{})
	handlerErr := make(chan error, 1)
	svc.fn = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		close(entered)
		<-hungUp
		// Give the server time to see the cancellation.
		time.Sleep(100 * time.Millisecond)
		handlerErr <- ctx.Err()
		return structpb.NewStruct(map[string]any{"transferId": "tr_after_hang_up"})
	}
	srv := newServer(t, svc, idemgrpc.Options{Wait: 5 * time.Second})
	cc := dial(t, srv.addr, false, false)
	ctx, cancel := context.WithCancel(callCtx(t, "k-hangup"))
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := create(ctx, cc, map[string]any{})
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("hung-up call: %v, want CANCELED", err)
	}
	close(hungUp)
	if err := <-handlerErr; err != nil {
		t.Fatalf("the handler's context ended when the client hung up: %v", err)
	}
	resp, header, _, err := create(callCtx(t, "k-hangup"), cc, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFields()["transferId"].GetStringValue() != "tr_after_hang_up" || len(header.Get(idemgrpc.MetadataReplayed)) == 0 {
		t.Errorf("retry: %v (header %v), want the stored answer replayed", resp, header)
	}
	if n := svc.execs.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// A deterministic rejection is stored and replayed with its code, message
// and details; a retryable failure is not stored, and the retry executes
// again.
func TestFailuresClassified(t *testing.T) {
	svc := newTransfers()
	var calls atomic.Int32
	svc.fn = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		calls.Add(1)
		switch req.GetFields()["case"].GetStringValue() {
		case "reject":
			st, err := status.New(codes.InvalidArgument, "insufficient funds").
				WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too high"}}})
			if err != nil {
				return nil, err
			}
			return nil, st.Err()
		case "flaky":
			return nil, status.Error(codes.Unavailable, "ledger busy")
		case "unknown":
			// Failed after a side effect: only Recover may settle it.
			idemgrpc.Classify(ctx, idem.StatusUnknown)
			return nil, status.Error(codes.Internal, "lost the ledger's answer")
		}
		return &structpb.Struct{}, nil
	}
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)

	var first error
	for i := range 2 {
		_, header, _, err := create(callCtx(t, "k-reject"), cc, map[string]any{"case": "reject"})
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || st.Message() != "insufficient funds" || len(st.Details()) != 1 {
			t.Fatalf("answer %d: %v, want INVALID_ARGUMENT with its detail", i, err)
		}
		if i == 0 {
			first = err
		} else {
			if !proto.Equal(status.Convert(first).Proto(), st.Proto()) {
				t.Errorf("replay %v, want %v", st.Proto(), status.Convert(first).Proto())
			}
			if len(header.Get(idemgrpc.MetadataReplayed)) == 0 {
				t.Errorf("a replayed status carries no %s", idemgrpc.MetadataReplayed)
			}
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("rejection executed %d times, want once", n)
	}

	for i := range 2 {
		_, _, _, err := create(callCtx(t, "k-flaky"), cc, map[string]any{"case": "flaky"})
		if status.Code(err) != codes.Unavailable || idemgrpc.ErrorCode(err) != "" {
			t.Fatalf("answer %d: %v, want the handler's own UNAVAILABLE", i, err)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d executions, want 3: a retryable failure executes again", n)
	}

	_, _, _, err := create(callCtx(t, "k-unknown"), cc, map[string]any{"case": "unknown"})
	if status.Code(err) != codes.Internal {
		t.Fatalf("first answer: %v, want the handler's own INTERNAL", err)
	}
	_, _, _, err = create(callCtx(t, "k-unknown"), cc, map[string]any{"case": "unknown"})
	wantCode(t, err, codes.Unavailable, idem.ECodeOutcomeUnknown)
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d executions, want 4: an unknown outcome is never executed again", n)
	}
}

// A record whose execution was lost is settled by the method's Recover,
// and the retry answers what Recover learnt.
func TestRecoverSettlesALostExecution(t *testing.T) {
	svc := newTransfers()
	svc.fn = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		idemgrpc.Classify(ctx, idem.StatusUnknown)
		return nil, status.Error(codes.Internal, "lost the ledger's answer")
	}
	var recovered atomic.Int32
	srv := newServer(t, svc, idemgrpc.Options{Methods: map[string]idemgrpc.Method{methodCreate: {
		Operation: opName,
		Recover: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			recovered.Add(1)
			resp, _ := structpb.NewStruct(map[string]any{"transferId": "tr_from_ledger"})
			return idemgrpc.Result(resp, nil)
		},
	}}})
	cc := dial(t, srv.addr, false, false)
	if _, _, _, err := create(callCtx(t, "k-lost"), cc, map[string]any{}); status.Code(err) != codes.Internal {
		t.Fatalf("first answer: %v", err)
	}
	for range 2 {
		resp, _, _, err := create(callCtx(t, "k-lost"), cc, map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetFields()["transferId"].GetStringValue(); got != "tr_from_ledger" {
			t.Errorf("answer %v, want the recovered transfer", resp)
		}
	}
	if n, r := svc.execs.Load(), recovered.Load(); n != 1 || r != 1 {
		t.Errorf("%d executions and %d recoveries, want one each", n, r)
	}
}

// A streaming call that carries a key, or whose method is named, is
// refused: its handler does not run.
func TestStreamsRefused(t *testing.T) {
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)
	desc := &serviceDesc.Streams[0]
	call := func(ctx context.Context) error {
		s, err := cc.NewStream(ctx, desc, methodWatch)
		if err != nil {
			return err
		}
		if err := s.SendMsg(&structpb.Struct{}); err != nil {
			return err
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		return s.RecvMsg(new(structpb.Struct))
	}
	wantCode(t, call(callCtx(t, "k-stream")), codes.Unimplemented, idem.ECodeMethodNotAllowed)
	if n := svc.execs.Load(); n != 0 {
		t.Fatalf("the stream's handler ran %d times", n)
	}
	if err := call(callCtx(t, "")); err != nil {
		t.Fatalf("a stream without a key: %v", err)
	}
}

// The client interceptor sets one key per logical call: two calls get two
// keys, and WithKey's key is kept.
func TestClientInterceptorKeys(t *testing.T) {
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-a")
	for range 2 {
		if _, _, _, err := create(ctx, cc, map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := create(idemgrpc.WithKey(ctx, "mine"), cc, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	keys := len(svc.byKey)
	mine := svc.byKey["mine"]
	svc.mu.Unlock()
	if keys != 3 || mine != 1 {
		t.Errorf("%d keys (mine %d), want 3 keys, one of them mine", keys, mine)
	}
}

// Metrics count calls by outcome, and a span of the injected provider
// records each call's outcome.
func TestMetricsAndTraces(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := idemprom.NewGRPC(reg)
	if err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{Metrics: m, TracerProvider: tp})
	cc := dial(t, srv.addr, false, false)
	for _, amount := range []string{"1", "1", "2"} {
		_, _, _, _ = create(callCtx(t, "k-obs"), cc, map[string]any{"amount": amount})
	}
	_, _, _, _ = create(callCtx(t, ""), cc, map[string]any{})
	for outcome, want := range map[string]float64{"execute": 1, "replay": 1, "conflict": 1, "rejected": 1, "error": 0} {
		c, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := 0.0
		for _, mf := range c {
			if mf.GetName() != "idemgrpc_requests_total" {
				continue
			}
			for _, s := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["operation"] == opName && labels["outcome"] == outcome {
					got = s.GetCounter().GetValue()
				}
			}
		}
		if got != want {
			t.Errorf("idemgrpc_requests_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	var outcomes []string
	for _, s := range exp.GetSpans() {
		if s.Name != "idemgrpc "+methodCreate {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "idem.outcome" {
				outcomes = append(outcomes, a.Value.AsString())
			}
		}
	}
	if got := strings.Join(outcomes, ","); got != "execute,replay,conflict,rejected" {
		t.Errorf("span outcomes %q, want execute,replay,conflict,rejected", got)
	}
}

// New refuses options that cannot work.
func TestNewRefuses(t *testing.T) {
	eng := engine.New(memcoord.New(), engine.Options{})
	for name, opts := range map[string]idemgrpc.Options{
		"no tenant":         {},
		"invalid operation": {Tenant: tenantOf, Methods: map[string]idemgrpc.Method{methodCreate: {Operation: "Not Valid"}}},
		"long default name": {Tenant: tenantOf, Methods: map[string]idemgrpc.Method{"/" + strings.Repeat("a", 70) + "/M": {}}},
	} {
		if _, err := idemgrpc.New(eng, opts); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if err := eng.Register(engine.Operation{Name: "taken", Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_, err := idemgrpc.New(eng, idemgrpc.Options{Tenant: tenantOf, Window: 2 * time.Hour, Methods: map[string]idemgrpc.Method{methodCreate: {Operation: "taken"}}})
	if err == nil {
		t.Error("New accepted a Window the engine's registration contradicts")
	}
	if _, err := idemgrpc.New(eng, idemgrpc.Options{Tenant: tenantOf, Methods: map[string]idemgrpc.Method{methodCreate: {Operation: "taken"}}}); err != nil {
		t.Errorf("New refused an operation registered already: %v", err)
	}
}

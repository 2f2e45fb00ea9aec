package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/internal/storetest"
)

// The test service, written by hand over well-known message types (no
// generated code): Transfers.Create makes a transfer, Transfers.Watch is a
// stream.
const (
	serviceName  = "idemtest.v1.Transfers"
	methodCreate = "/" + serviceName + "/Create"
	methodWatch  = "/" + serviceName + "/Watch"
	opName       = "create_transfer"
)

// transfers is the service's implementation: fn answers each execution
// (the default makes a transfer tr_N from the request's "from" field).
type transfers struct {
	fn    func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
	execs atomic.Int64
	// byKey counts executions per idempotency key (the handler sees the
	// call's metadata).
	mu    sync.Mutex
	byKey map[string]int
	// first is the answer of each key's first execution.
	first map[string]*structpb.Struct
}

func newTransfers() *transfers {
	return &transfers{byKey: map[string]int{}, first: map[string]*structpb.Struct{}}
}

func (s *transfers) create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	n := s.execs.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	key := ""
	if v := md.Get(idemgrpc.MetadataKey); len(v) > 0 {
		key = v[0]
	}
	var (
		resp *structpb.Struct
		err  error
	)
	if s.fn != nil {
		resp, err = s.fn(ctx, req)
	} else {
		resp, err = structpb.NewStruct(map[string]any{"transferId": fmt.Sprintf("tr_%d", n), "from": req.GetFields()["from"].GetStringValue()})
	}
	s.mu.Lock()
	s.byKey[key]++
	if _, ok := s.first[key]; !ok && err == nil {
		s.first[key] = resp
	}
	s.mu.Unlock()
	return resp, err
}

func (s *transfers) executions(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key]
}

func (s *transfers) firstAnswer(key string) *structpb.Struct {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first[key]
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			s := srv.(*transfers)
			if interceptor == nil {
				return s.create(ctx, req)
			}
			return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodCreate},
				func(ctx context.Context, req any) (any, error) { return s.create(ctx, req.(*structpb.Struct)) })
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			srv.(*transfers).execs.Add(1)
			return stream.SendMsg(&structpb.Struct{})
		},
	}},
}

// tokens maps bearer tokens (authorization metadata) to tenants.
var tokens = map[string]string{"Bearer tok-a": "tenant-a", "Bearer tok-b": "tenant-b"}

func tenantOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && tokens[v[0]] != "" {
		return tokens[v[0]], nil
	}
	return "", fmt.Errorf("unknown token")
}

// server is a real gRPC server with the interceptor in front of the test
// service, on a PostgreSQL store.
type server struct {
	svc  *transfers
	ic   *idemgrpc.Interceptor
	addr string
	lis  *dropListener
}

// newServer starts a server; outer, if set, runs outside the interceptor
// (a transport fault of the test's).
func newServer(t *testing.T, svc *transfers, opts idemgrpc.Options, outer ...grpc.UnaryServerInterceptor) *server {
	t.Helper()
	st, _ := storetest.New(t)
	eng := engine.New(st, engine.Options{PollMin: 5 * time.Millisecond, PollMax: 50 * time.Millisecond})
	if opts.Tenant == nil {
		opts.Tenant = tenantOf
	}
	if opts.Methods == nil {
		opts.Methods = map[string]idemgrpc.Method{methodCreate: {Operation: opName}}
	}
	ic, err := idemgrpc.New(eng, opts)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := &dropListener{Listener: inner, conns: map[string]net.Conn{}}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, ic.Unary())...), grpc.StreamInterceptor(ic.Stream()))
	srv.RegisterService(&serviceDesc, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return &server{svc: svc, ic: ic, addr: inner.Addr().String(), lis: lis}
}

// dropListener keeps its connections by remote address, so that a fault
// can close the one a call came on.
type dropListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[string]net.Conn
}

func (l *dropListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c.RemoteAddr().String()] = c
	l.mu.Unlock()
	return c, nil
}

// drop closes the connection the call of ctx came on: its answer never
// reaches the client, which sees UNAVAILABLE.
func (l *dropListener) drop(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	l.mu.Lock()
	c := l.conns[p.Addr.String()]
	delete(l.conns, p.Addr.String())
	l.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// retryConfig retries UNAVAILABLE (a lost answer) and ABORTED (a key in
// progress, with the server's pushback).
const retryConfig = `{"methodConfig": [{
  "name": [{"service": "idemtest.v1.Transfers"}],
  "retryPolicy": {
    "maxAttempts": 5,
    "initialBackoff": "0.02s",
    "maxBackoff": "0.2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]
  }
}]}`

// dial returns a client of addr; retries turns the retry policy on; with
// keys, the client interceptor sets a key per call.
func dial(t *testing.T, addr string, retries, keys bool) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if retries {
		opts = append(opts, grpc.WithDefaultServiceConfig(retryConfig))
	} else {
		opts = append(opts, grpc.WithDisableRetry())
	}
	if keys {
		opts = append(opts, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// callCtx is a call context with tok-a's credential and, unless key is "",
// the key.
func callCtx(t *testing.T, key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-a")
	if key != "" {
		ctx = idemgrpc.WithKey(ctx, key)
	}
	return ctx
}

// create calls Transfers.Create and returns its answer and metadata.
func create(ctx context.Context, cc *grpc.ClientConn, fields map[string]any, opts ...grpc.CallOption) (*structpb.Struct, metadata.MD, metadata.MD, error) {
	req, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, nil, nil, err
	}
	var header, trailer metadata.MD
	resp := new(structpb.Struct)
	err = cc.Invoke(ctx, methodCreate, req, resp, append(opts, grpc.Header(&header), grpc.Trailer(&trailer))...)
	if err != nil {
		return nil, header, trailer, err
	}
	return resp, header, trailer, nil
}

// wantCode fails unless err is a status of code whose ErrorInfo carries
// errorCode.
func wantCode(t *testing.T, err error, code codes.Code, errorCode string) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("code = %v (%v), want %v", got, err, code)
	}
	if got := idemgrpc.ErrorCode(err); got != errorCode {
		t.Fatalf("errorCode = %q, want %q", got, errorCode)
	}
}

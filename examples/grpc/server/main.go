// Command server is the gRPC walkthrough's server: Transfers/Create made
// idempotent with idemgrpc on PostgreSQL, behind a network that loses
// answers. After the handler of a call has run (and its answer is stored),
// the server closes the call's connection instead of answering, for the
// first --lose attempts of each key: the client sees UNAVAILABLE, as when
// a load balancer or a node dies after the work was done, and its retry
// policy sends the call again with the same key.
//
//	API_TOKEN=dev-token DATABASE_URL=postgres://... go run ./examples/grpc/server --listen 127.0.0.1:9090
//
// It prints "listening on ADDR" once it serves, and a line per execution.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/examples/grpc/transfers"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9090", "address to serve gRPC on")
	lose := fs.Int("lose", 1, "lose the answers of each key's first N attempts (close the connection after the handler ran)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	token := os.Getenv("API_TOKEN")
	if token == "" {
		return errors.New("set API_TOKEN: the bearer token of tenant acme")
	}
	st, err := store.Open(ctx, os.Getenv("DATABASE_URL"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	eng := engine.New(st, engine.Options{})
	ic, err := idemgrpc.New(eng, idemgrpc.Options{
		Tenant: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("authorization"); len(v) == 1 && v[0] == "Bearer "+token {
				return "acme", nil
			}
			return "", errors.New("unknown token")
		},
		// Create is idempotent; Executions, a read, passes through.
		Methods: map[string]idemgrpc.Method{transfers.Create: {Operation: "create_transfer"}},
	})
	if err != nil {
		return err
	}
	go eng.Run(ctx, 5*time.Second, 0)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	lossy := &lossyNetwork{Listener: ln, conns: map[string]net.Conn{}, attempts: map[string]int{}, lose: *lose}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lossy.intercept, ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	srv.RegisterService(&transfers.Desc, &service{})
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	fmt.Printf("listening on %s\n", ln.Addr())
	return srv.Serve(lossy)
}

// service makes transfers: tr_1, tr_2, ...
type service struct{ n atomic.Int64 }

func (s *service) Create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	n := s.n.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	fmt.Printf("executed %s: tr_%d\n", md.Get(idemgrpc.MetadataKey), n)
	return structpb.NewStruct(map[string]any{
		"transferId": fmt.Sprintf("tr_%d", n),
		"to":         req.GetFields()["to"].GetStringValue(),
		"amount":     req.GetFields()["amount"].GetStringValue(),
	})
}

func (s *service) Executions(context.Context) (int64, error) { return s.n.Load(), nil }

// lossyNetwork is the network that loses answers: a listener that keeps
// its connections by peer address, and an interceptor, outside idemgrpc,
// that closes a call's connection after the call was served.
type lossyNetwork struct {
	net.Listener
	lose int

	mu       sync.Mutex
	conns    map[string]net.Conn
	attempts map[string]int
}

func (l *lossyNetwork) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c.RemoteAddr().String()] = c
	l.mu.Unlock()
	return c, nil
}

func (l *lossyNetwork) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	md, _ := metadata.FromIncomingContext(ctx)
	keys := md.Get(idemgrpc.MetadataKey)
	p, ok := peer.FromContext(ctx)
	if info.FullMethod != transfers.Create || len(keys) != 1 || !ok {
		return resp, err
	}
	l.mu.Lock()
	l.attempts[keys[0]]++
	drop := l.attempts[keys[0]] <= l.lose
	c := l.conns[p.Addr.String()]
	if drop {
		delete(l.conns, p.Addr.String())
	}
	l.mu.Unlock()
	if drop && c != nil {
		fmt.Printf("lost the answer to %s\n", keys[0])
		_ = c.Close()
	}
	return resp, err
}

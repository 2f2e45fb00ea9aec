// Command consumer is a service of its own that makes its transfers
// idempotent with the library, as a team adopting it would: a module that
// requires github.com/idemcoord/idem and imports store, engine, idemhttp,
// idemgrpc and fencing. It serves its transfers over HTTP and over gRPC
// (Transfers/Create, on :9090), both through one engine. It is built in CI to show what such a module's build list holds:
// none of the repository's tooling (the chaos harness, the local cluster,
// testcontainers, toxiproxy, porcupine, the etcd server).
//
//	DATABASE_URL=postgres://... ETCD_ENDPOINTS=http://127.0.0.1:2379 go run .
//
// ETCD_ENDPOINTS is optional: with it, recovery takes the fencing lock of
// etcd before it settles a record whose answer was lost.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fencing"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	st, err := store.Open(ctx, os.Getenv("DATABASE_URL"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}

	opts := engine.Options{Logger: slog.Default()}
	if eps := os.Getenv("ETCD_ENDPOINTS"); eps != "" {
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(eps, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer cli.Close()
		lease, err := fencing.Grant(ctx, cli, 10*time.Second)
		if err != nil {
			return err
		}
		defer lease.Close(context.WithoutCancel(ctx))
		locker, err := fencing.NewLocker(cli, lease, "consumer/locks/")
		if err != nil {
			return err
		}
		defer locker.Close()
		opts.Locker = locker
	}
	eng := engine.New(st, opts)

	idempotent, err := idemhttp.Middleware(eng, idemhttp.Options{
		Operation: "create_transfer",
		Tenant:    idemhttp.BearerTokens(map[string]string{os.Getenv("API_TOKEN"): "acme"}),
	})
	if err != nil {
		return err
	}
	var transfers atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{account}/transfers", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transferId":"tr_%d","from":%q}`, transfers.Add(1), r.PathValue("account"))
	})))
	go eng.Run(ctx, 5*time.Second, 0)

	// The same transfers over gRPC: a key in the idempotency-key metadata.
	grpcSrv, err := grpcServer(eng, &transfers)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:9090")
	if err != nil {
		return err
	}
	go func() { _ = grpcSrv.Serve(lis) }()
	defer grpcSrv.Stop()

	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

const createMethod = "/consumer.v1.Transfers/Create"

// grpcServer serves Transfers/Create (a google.protobuf.Struct in and out;
// a service of your own has generated code instead) behind idemgrpc.
func grpcServer(eng *engine.Engine, transfers *atomic.Int64) (*grpc.Server, error) {
	ic, err := idemgrpc.New(eng, idemgrpc.Options{
		Tenant: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("authorization"); len(v) == 1 && os.Getenv("API_TOKEN") != "" && v[0] == "Bearer "+os.Getenv("API_TOKEN") {
				return "acme", nil
			}
			return "", errors.New("unknown token")
		},
		Methods: map[string]idemgrpc.Method{createMethod: {Operation: "create_transfer_grpc"}},
	})
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "consumer.v1.Transfers",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			return in(ctx, req, &grpc.UnaryServerInfo{FullMethod: createMethod}, func(ctx context.Context, _ any) (any, error) {
				return structpb.NewStruct(map[string]any{"transferId": fmt.Sprintf("tr_%d", transfers.Add(1))})
			})
		}}},
	}, nil)
	return srv, nil
}

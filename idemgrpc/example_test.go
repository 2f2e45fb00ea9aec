package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/memcoord"
)

// A service's own method, Transfers/Create, made idempotent: the handler
// knows nothing of keys; the second call with the same key gets the first
// answer with idempotent-replayed: true, and the transfer is made once.
// The engine keeps its records in memory here (package memcoord, for
// tests); a service gives it a *store.Store on PostgreSQL or CockroachDB.
func Example() {
	eng := engine.New(memcoord.New(), engine.Options{})
	ic, err := idemgrpc.New(eng, idemgrpc.Options{
		// Your own authentication: here a token in the call's metadata.
		Tenant: func(ctx context.Context) (string, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) == 1 && md.Get("authorization")[0] == "Bearer secret-token" {
				return "acme", nil
			}
			return "", fmt.Errorf("unknown token")
		},
		Methods: map[string]idemgrpc.Method{"/example.v1.Transfers/Create": {Operation: "create_transfer"}},
	})
	if err != nil {
		panic(err)
	}
	var transfers atomic.Int64
	create := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		n := transfers.Add(1)
		return structpb.NewStruct(map[string]any{"transferId": fmt.Sprintf("tr_%d", n), "to": req.GetFields()["to"].GetStringValue()})
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "example.v1.Transfers",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			return in(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/example.v1.Transfers/Create"},
				func(ctx context.Context, req any) (any, error) { return create(ctx, req.(*structpb.Struct)) })
		}}},
	}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer secret-token")
	// One key for both calls: an application's own retry. (Without
	// WithKey, the client interceptor gives each call a key of its own,
	// kept across gRPC's retries.)
	ctx = idemgrpc.WithKey(ctx, "order-42")
	req, _ := structpb.NewStruct(map[string]any{"amount": "10.00", "to": "acc_2"})
	for range 2 {
		var header metadata.MD
		resp := new(structpb.Struct)
		if err := cc.Invoke(ctx, "/example.v1.Transfers/Create", req, resp, grpc.Header(&header)); err != nil {
			panic(err)
		}
		fmt.Printf("%s to %s replayed=%q\n", resp.GetFields()["transferId"].GetStringValue(),
			resp.GetFields()["to"].GetStringValue(), header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("transfers made:", transfers.Load())
	// Output:
	// tr_1 to acc_2 replayed=[]
	// tr_1 to acc_2 replayed=["true"]
	// transfers made: 1
}

// Package transfers is the walkthrough's gRPC service, written by hand over
// well-known message types (google.protobuf.Struct in and out,
// Int64Value for the count), so that it needs no generated code: a service
// of your own has its generated ServiceDesc and messages instead.
package transfers

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Full method names.
const (
	Service = "walkthrough.v1.Transfers"
	// Create makes a transfer: the idempotent method.
	Create = "/" + Service + "/Create"
	// Executions answers how many transfers the server made: a read that
	// the interceptor lets through untouched.
	Executions = "/" + Service + "/Executions"
)

// Server is what the service does.
type Server interface {
	Create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
	Executions(ctx context.Context) (int64, error)
}

// Desc is the service's description, to register with grpc.Server.
var Desc = grpc.ServiceDesc{
	ServiceName: Service,
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(Server).Create(ctx, req.(*structpb.Struct))
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: Create}, h)
		}},
		{MethodName: "Executions", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(emptypb.Empty)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				n, err := srv.(Server).Executions(ctx)
				if err != nil {
					return nil, err
				}
				return wrapperspb.Int64(n), nil
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: Executions}, h)
		}},
	},
}

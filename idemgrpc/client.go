package idemgrpc

import (
	"context"
	"crypto/rand"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ClientOptions configure UnaryClientInterceptor.
type ClientOptions struct {
	// Methods are the full method names whose calls get a key; nil: every
	// unary method.
	Methods []string
	// NewKey returns a fresh key. Default NewKey.
	NewKey func() string
}

// NewKey returns a fresh idempotency key: 26 characters of crypto/rand's
// Text (128 bits of randomness).
func NewKey() string { return rand.Text() }

// UnaryClientInterceptor returns a client interceptor that gives every
// logical call of a covered method one idempotency key: the key the call's
// context carries already (WithKey), or a fresh one. gRPC's own retries of
// the call (a retry policy in the service config, transparent retries)
// happen below the interceptor and resend the same metadata, so they
// carry the same key: a retry after a lost answer is answered with the
// first answer, not executed again. A retry loop of the application's own
// keeps one key across its attempts with WithKey.
func UnaryClientInterceptor(opts ClientOptions) grpc.UnaryClientInterceptor {
	newKey := opts.NewKey
	if newKey == nil {
		newKey = NewKey
	}
	methods := slices.Clone(opts.Methods)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if methods != nil && !slices.Contains(methods, method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, ok := metadata.FromOutgoingContext(ctx); !ok || len(md.Get(MetadataKey)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, newKey())
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// WithKey returns ctx carrying key as the idempotency-key of the calls made
// with it, in place of any it carried: for an application's own retry loop
// (every attempt with the same key) or a key derived from the command
// (an order's id).
func WithKey(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(MetadataKey, key)
	return metadata.NewOutgoingContext(ctx, md)
}

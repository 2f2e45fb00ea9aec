package collectors

import (
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// EtcdClientMetrics registers the gRPC client metrics of an etcd client
// (grpc_client_started_total, grpc_client_handled_total by grpc_code,
// grpc_client_handling_seconds and the message counters, labelled by etcd's
// gRPC service and method) on reg, and returns the dial options that
// record them: append them to clientv3.Config.DialOptions.
func EtcdClientMetrics(reg prometheus.Registerer) ([]grpc.DialOption, error) {
	m := grpcprom.NewClientMetrics(grpcprom.WithClientHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets(prometheus.ExponentialBuckets(0.0005, 2, 16))))
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(m.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(m.StreamClientInterceptor()),
	}, nil
}

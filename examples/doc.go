// Package examples holds runnable walkthroughs (see README.md): the sidecar
// in front of a plain upstream (sidecar/, with the upstream program in
// sidecar/upstream), the coordination API with curl (coordination/), and
// gRPC through idemgrpc with a client that retries (grpc/). Their test runs
// each against real processes on PostgreSQL.
package examples

//go:build !operator

package main

// toolingCommands are the commands for development, tests and drills: a
// local cluster, benchmarks, images, the chaos harness, soaks and drills.
// They link the harness (toxiproxy, porcupine, the cluster launcher), so the
// production image's idemctl, built with the operator tag, leaves them out.
func toolingCommands() map[string]command {
	return map[string]command{
		"up":        {"start a local cluster (PostgreSQL + idemd nodes) and print its endpoints", runUp},
		"bench":     {"benchmark the payment write with and without the idempotency layer", runBench},
		"images":    {"build the container images with the local Docker engine, nothing pulled (images build [--patroni] | images tags)", runImages},
		"chaos":     {"chaos tests: list the scenarios, or run them against a local cluster and check the history (chaos list|run)", runChaos},
		"wan-proxy": {"serve toxiproxy's API and proxies: the WAN container of the docker chaos environment (chaos run --env docker)", runWANProxy},
		"grpc-node": {"serve the gRPC chaos scenario's service (Transfers/Create through idemgrpc on --database-url): the process grpc-kill kills mid-call", runGRPCNode},
		"soak":      {"run mixed traffic with faults against a local cluster for --duration, sample the nodes, stores and provider, and fail on growth that does not level off or drifting throughput or p99", runSoak},
		"drill":     {"failover drill against a running cluster: --inject and --heal commands, manual or automatic failover, the chaos checks and a report with RTO and RPO", runDrill},
	}
}

package region

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
)

// Operation is an operation the node serves itself, with endpoints of its
// own on the node's API and records of its own (payments is one, registered
// by package payments/paymentsnode). NewServer serves a list of them.
type Operation struct {
	// Name is the operation part of its records' scopes. The coordination
	// API refuses it: a node's own records are acted on by its own
	// recovery, and their stored bodies are never shown.
	Name string
	// Routes returns the operation's endpoints on s. Each is served
	// authenticated (the tenant comes from the bearer token, or from the
	// authenticated peer that forwarded the request) and routed to the
	// tenant's home region before its handler runs.
	Routes func(s *Server) []Route
	// Engine is the operation as the engine runs it: window, lock timeout
	// and Recover. The node registers it in its engine (Config.Engine),
	// whose RecoverStale the recovery worker runs for every operation.
	// Optional.
	Engine *engine.Operation
	// Errors are the error codes the operation answers with besides
	// package idem's, with their statuses, Retry-After and titles: the node
	// adds them to its one table (idemhttp.Errors.With), which every
	// surface answers through. A code may not change how another answers.
	Errors map[string]idemhttp.ErrorClass
	// RecoveryOutcomes are outcomes its Recover counts besides the
	// engine's (engine.RecoveryOutcomes), so that their series exist from
	// the start.
	RecoveryOutcomes []string
	// Collectors are metrics of the operation's own, registered in the
	// node's registry (Config.Registry) with the node's.
	Collectors []prometheus.Collector
	// Recovered, when set, is told the outcomes of each recovery pass of
	// the node's engine (outcome -> records), for metrics of its own.
	Recovered func(outcomes map[string]int)
	// Workers, when set, starts the operation's own background work when
	// the node starts its workers (StartWorkers), with Server.Every so
	// that Close waits for it (payments: its outbox's publisher, consumers
	// and receipt sender).
	Workers func(ctx context.Context, s *Server, cfg WorkerConfig)
	// WorkerNames are the names Workers gives Server.Every, so that their
	// series of idempotency_worker_errors_total exist from the start.
	WorkerNames []string
}

// Route is one endpoint of an Operation.
type Route struct {
	// Pattern is a net/http pattern with its method, "POST /orders".
	Pattern string
	// Handler serves a request of tenant.
	Handler TenantHandler
}

// TenantHandler serves an authenticated request of tenant.
type TenantHandler func(w http.ResponseWriter, r *http.Request, tenant string)

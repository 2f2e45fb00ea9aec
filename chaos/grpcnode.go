package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemgrpc"
	"github.com/idemcoord/idem/store"
)

// The gRPC scenario's service: Transfers/Create, served by gRPC nodes
// (idemctl grpc-node) through idemgrpc on a region's store. Each execution
// writes a row of grpcEffectsTable, its side effect, with no constraint
// that could refuse a second one: the checks count the rows per key.
const (
	grpcService   = "chaos.v1.Transfers"
	grpcMethod    = "/" + grpcService + "/Create"
	grpcOperation = "grpc_transfer"
	// grpcEffectsTable holds one row per execution of a key.
	grpcEffectsTable = "chaos_grpc_effects"
	// grpcTokenEnv names the environment variable that holds the bearer
	// token of the gRPC nodes' one tenant, grpcTenant.
	grpcTokenEnv = "IDEM_GRPC_TOKEN"
	grpcTenant   = "grpc-tenant"
)

// grpcEffectsDDL creates the effects table (the harness runs it once
// before the nodes start).
const grpcEffectsDDL = `CREATE TABLE IF NOT EXISTS ` + grpcEffectsTable + ` (
	id BIGSERIAL PRIMARY KEY,
	tenant_id TEXT NOT NULL,
	idempotency_key TEXT NOT NULL,
	created_at TIMESTAMPTZ NOT NULL DEFAULT now())`

// GRPCNodeConfig configures RunGRPCNode.
type GRPCNodeConfig struct {
	// Listen is the gRPC address.
	Listen string
	// DatabaseURL is the store (and the effects table's database).
	DatabaseURL string
	// Token is the bearer token of the node's tenant (from the
	// environment, IDEM_GRPC_TOKEN).
	Token string
	// Name names the node in its records (engine.Options.Owner).
	Name string
	// LockFor is the operation's lock timeout: how long a killed node's
	// call blocks its key before a retry takes it over.
	LockFor time.Duration
	// Hold is how long a call is held after its side effect, before it
	// answers: the window in which a kill leaves an effect without its
	// record settled.
	Hold time.Duration
	// Stdout gets "listening on ADDR" once the node serves.
	Stdout io.Writer
	Logger *slog.Logger
}

// RunGRPCNode serves the gRPC scenario's Transfers/Create until ctx ends:
// the operation behind idemgrpc, its Recover (which asks the effects table
// whether a call lost with its node had acted) and the engine's recovery
// loop.
func RunGRPCNode(ctx context.Context, cfg GRPCNodeConfig) error {
	if cfg.Token == "" {
		return fmt.Errorf("chaos: grpc-node: set %s", grpcTokenEnv)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	st, err := store.Open(ctx, cfg.DatabaseURL, store.Options{})
	if err != nil {
		return fmt.Errorf("chaos: grpc-node: %w", err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return fmt.Errorf("chaos: grpc-node: %w", err)
	}
	effects, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("chaos: grpc-node: %w", err)
	}
	defer effects.Close()

	eng := engine.New(st, engine.Options{Owner: cfg.Name, Logger: cfg.Logger})
	n := &grpcNode{effects: effects, hold: cfg.Hold}
	ic, err := idemgrpc.New(eng, idemgrpc.Options{
		Tenant: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("authorization"); len(v) == 1 && v[0] == "Bearer "+cfg.Token {
				return grpcTenant, nil
			}
			return "", errors.New("unknown token")
		},
		Methods: map[string]idemgrpc.Method{grpcMethod: {Operation: grpcOperation, Recover: n.recover}},
		LockFor: cfg.LockFor,
		Logger:  cfg.Logger,
	})
	if err != nil {
		return err
	}
	go eng.Run(ctx, time.Second, 0)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("chaos: grpc-node: %w", err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	srv.RegisterService(&grpcServiceDesc, n)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if cfg.Stdout != nil {
		fmt.Fprintf(cfg.Stdout, "listening on %s\n", ln.Addr())
	}
	return srv.Serve(ln)
}

// grpcNode is the service: an execution writes its effect row, holds, and
// answers the row's transfer id.
type grpcNode struct {
	effects *pgxpool.Pool
	hold    time.Duration
}

func (n *grpcNode) create(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
	a := idemgrpc.AttemptFrom(ctx)
	if a == nil {
		return nil, errors.New("chaos: grpc-node: a call outside the interceptor")
	}
	var id int64
	if err := n.effects.QueryRow(ctx, `INSERT INTO `+grpcEffectsTable+` (tenant_id, idempotency_key) VALUES ($1, $2) RETURNING id`,
		a.Record.Tenant, a.Record.Key).Scan(&id); err != nil {
		// The insert may have committed without its answer: the outcome
		// is Recover's to find out.
		idemgrpc.Classify(ctx, idem.StatusUnknown)
		return nil, fmt.Errorf("chaos: grpc-node: effect: %w", err)
	}
	sleepCtx(ctx, n.hold)
	return transferAnswer(id)
}

// recover settles a call its node lost: the transfer its effect row
// records, or, with no row, nothing happened and the call runs again.
func (n *grpcNode) recover(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
	var id int64
	err := n.effects.QueryRow(ctx, `SELECT id FROM `+grpcEffectsTable+` WHERE tenant_id = $1 AND idempotency_key = $2 ORDER BY id LIMIT 1`,
		a.Record.Tenant, a.Record.Key).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return engine.Result{Status: idem.StatusFailedRetryable}, nil
	case err != nil:
		return engine.Result{Status: idem.StatusUnknown}, fmt.Errorf("chaos: grpc-node: recover: %w", err)
	}
	resp, err := transferAnswer(id)
	if err != nil {
		return engine.Result{}, err
	}
	return idemgrpc.Result(resp, nil)
}

// transferAnswer is the answer of the execution whose effect row is id.
func transferAnswer(id int64) (*structpb.Struct, error) {
	return structpb.NewStruct(map[string]any{"transferId": fmt.Sprintf("tr_%d", id)})
}

// grpcServiceDesc is the service, by hand over google.protobuf.Struct.
var grpcServiceDesc = grpc.ServiceDesc{
	ServiceName: grpcService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			n := srv.(*grpcNode)
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcMethod},
				func(ctx context.Context, req any) (any, error) { return n.create(ctx, req.(*structpb.Struct)) })
		},
	}},
}

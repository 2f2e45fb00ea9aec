// Command client is the gRPC walkthrough's client: a grpc-go client whose
// service config retries UNAVAILABLE and ABORTED, with idemgrpc's client
// interceptor, so that every call has one idempotency key across its
// retries.
//
//	API_TOKEN=dev-token go run ./examples/grpc/client --target 127.0.0.1:9090
//
// It makes --calls transfers, --parallel at a time, against the
// walkthrough's server (which loses the first answer of each key), then
// reuses a key with another request, and checks what it got: every call
// answered with the first answer (idempotent-replayed: true, since that
// answer was lost on its way); one execution per call, as the server
// counts them; the reused key refused with FAILED_PRECONDITION
// IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST. It prints "walkthrough
// passed" when every check holds, and exits 1 otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/examples/grpc/transfers"
	"github.com/idemcoord/idem/idemgrpc"
)

// retryPolicy is the service config: UNAVAILABLE (a lost answer, a node
// gone) and ABORTED (the key's first call still running; the server's
// pushback says when to come back) are retried, five attempts at most.
const retryPolicy = `{"methodConfig": [{
  "name": [{"service": "walkthrough.v1.Transfers"}],
  "retryPolicy": {
    "maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]
  }
}]}`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	fmt.Println("walkthrough passed")
}

func run(args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	target := fs.String("target", "127.0.0.1:9090", "the server's address")
	calls := fs.Int("calls", 8, "transfers to make")
	parallel := fs.Int("parallel", 4, "calls at a time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+os.Getenv("API_TOKEN"))
	dial := func() (*grpc.ClientConn, error) {
		return grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(retryPolicy),
			grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{Methods: []string{transfers.Create}})))
	}
	before, err := executions(ctx, dial)
	if err != nil {
		return err
	}

	// The transfers, each client on a connection of its own (a lost answer
	// closes it).
	var (
		mu       sync.Mutex
		failures []error
		ids      = map[string]bool{}
		wg       sync.WaitGroup
		next     = make(chan int)
	)
	for range *parallel {
		wg.Go(func() {
			cc, err := dial()
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
				return
			}
			defer cc.Close()
			for i := range next {
				req, _ := structpb.NewStruct(map[string]any{"to": fmt.Sprintf("acc_%d", i), "amount": "10.00"})
				var header metadata.MD
				resp := new(structpb.Struct)
				err := cc.Invoke(ctx, transfers.Create, req, resp, grpc.Header(&header))
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, fmt.Errorf("transfer %d: %w", i, err))
				case len(header.Get(idemgrpc.MetadataReplayed)) == 0:
					failures = append(failures, fmt.Errorf("transfer %d: answered without %s, but its first answer was lost", i, idemgrpc.MetadataReplayed))
				default:
					id := resp.GetFields()["transferId"].GetStringValue()
					fmt.Printf("transfer %d: %s to %s (replayed: %s)\n", i, id, resp.GetFields()["to"].GetStringValue(), header.Get(idemgrpc.MetadataReplayed)[0])
					ids[id] = true
				}
				mu.Unlock()
			}
		})
	}
	for i := range *calls {
		next <- i
	}
	close(next)
	wg.Wait()
	after, err := executions(ctx, dial)
	if err != nil {
		return err
	}
	fmt.Printf("%d calls, %d transfers answered, %d executions\n", *calls, len(ids), after-before)
	if len(ids) != *calls || after-before != int64(*calls) {
		failures = append(failures, fmt.Errorf("want %d distinct transfers from %d executions", *calls, *calls))
	}

	// A key reused with another request.
	cc, err := dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	kctx := idemgrpc.WithKey(ctx, fmt.Sprintf("walkthrough-%d", time.Now().UnixNano()))
	for i, amount := range []string{"10.00", "99.00"} {
		req, _ := structpb.NewStruct(map[string]any{"to": "acc_x", "amount": amount})
		err := cc.Invoke(kctx, transfers.Create, req, new(structpb.Struct))
		switch {
		case i == 0 && err != nil:
			failures = append(failures, fmt.Errorf("first call of the reused key: %w", err))
		case i == 1:
			fmt.Printf("same key, amount %s: %s %s\n", amount, idemgrpc.CodeName(status.Code(err)), idemgrpc.ErrorCode(err))
			if status.Code(err) != codes.FailedPrecondition || idemgrpc.ErrorCode(err) != idem.ECodeKeyReused {
				failures = append(failures, fmt.Errorf("a reused key answered %v", err))
			}
		}
	}
	return errors.Join(failures...)
}

// executions asks the server how many transfers it made.
func executions(ctx context.Context, dial func() (*grpc.ClientConn, error)) (int64, error) {
	cc, err := dial()
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	n := new(wrapperspb.Int64Value)
	if err := cc.Invoke(ctx, transfers.Executions, &emptypb.Empty{}, n); err != nil {
		return 0, err
	}
	return n.GetValue(), nil
}

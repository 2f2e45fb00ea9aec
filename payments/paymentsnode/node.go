// Package paymentsnode serves the payments operation on a regional node (package
// region) as one operation among others: POST /payments and GET
// /payments/{id} behind the idempotency middleware (package idemhttp), its
// error codes, recovery outcomes and metrics, and the workers of its outbox
// (package outbox). idemd registers it unless it runs with
// --payments=false; the node itself knows nothing of payments.
package paymentsnode

import (
	"context"
	"errors"
	"mime"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/outbox"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/region"
)

// Outbox configures the payments outbox's workers on the node.
type Outbox struct {
	// Interval is how often the publisher, each consumer and the email
	// sender run (each drains while it finds full batches). Zero: no
	// outbox workers. Suggested: 200ms.
	Interval time.Duration
	// Batch bounds one publish, consume or send batch. Default 100.
	Batch int
	// Duplicate delivers every outbox event twice (a fault the chaos
	// harness and tests use to prove that consumers deduplicate).
	Duplicate bool
	// EffectGuard, when set, makes the ledger and receipt-email consumers
	// claim each effect in a database every region sees before producing
	// it (outbox.WithEffectGuard), so that a payment recorded again in its
	// new home after a failover emits nothing twice.
	EffectGuard *outbox.EffectGuard
	// Retention is how long published events, processed deliveries and
	// inbox rows, and sent receipts are kept before the outbox-prune
	// worker deletes them (outbox.Prune). Zero keeps them for good.
	Retention time.Duration
}

// Operation is the reference operation, create_payment, as one of a node's
// operations: POST /payments and GET /payments/{id}, its engine operation
// (recovery asks the provider before it charges again), its recovery
// outcomes, its metrics and its outbox's workers. POST /payments is the
// payments handler behind the idempotency middleware, as a user's operation
// would be.
func Operation(pay *payments.Service, ob Outbox) region.Operation {
	op := pay.EngineOperation()
	keyConflicts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idempotency_provider_key_conflicts_total", Help: "Payments ended CONFLICT because the provider held another charge under their provider key (an operator must look).",
	})
	retryShare := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idempotency_payment_retry_share",
		Help: "Share of recent create_payment claims whose key was settled already (retries and reused keys); above 0.6 a claim reads first.",
	}, pay.RetryShare)
	w := newOutboxWorkers(pay, ob)
	return region.Operation{
		Name: payments.Operation,
		Routes: func(s *region.Server) []region.Route {
			return []region.Route{
				{Pattern: "POST /payments", Handler: createPaymentHandler(s, pay, keyConflicts)},
				{Pattern: "GET /payments/{id}", Handler: func(w http.ResponseWriter, r *http.Request, tenant string) { getPayment(s, pay, w, r, tenant) }},
			}
		},
		Engine:           &op,
		Errors:           payments.Errors,
		RecoveryOutcomes: payments.RecoveryOutcomes,
		Collectors:       append([]prometheus.Collector{keyConflicts, retryShare}, w.collectors()...),
		Workers:          func(ctx context.Context, s *region.Server, _ region.WorkerConfig) { w.start(ctx, s) },
		WorkerNames:      outboxWorkerNames,
		Recovered: func(out map[string]int) {
			keyConflicts.Add(float64(out[payments.RecoveryConflict]))
		},
	}
}

// paymentRequest is what POST /payments's middleware options learn of one
// request: its tenant (authenticated by the node) and, once parsed, its
// payments.Call (for the metrics of what the call found).
type paymentRequest struct {
	tenant string
	call   *payments.Call
}

type paymentRequestKey struct{}

func paymentRequestOf(ctx context.Context) *paymentRequest {
	pr, _ := ctx.Value(paymentRequestKey{}).(*paymentRequest)
	return pr
}

// createPaymentHandler is POST /payments: payments' handler (it charges
// under the attempt the middleware hands it and records the payment's
// result with the record, idemhttp.Stored) behind the idempotency
// middleware, which parses the command with payments (its fingerprint, and
// its claim that writes the payment in the claim's transaction), waits,
// replays and refuses as for any operation, and answers with the node's
// errors and metrics.
func createPaymentHandler(s *region.Server, pay *payments.Service, keyConflicts prometheus.Counter) region.TenantHandler {
	mw, err := idemhttp.Middleware(pay.Engine(), idemhttp.Options{
		// The service registered create_payment (its own claim, replay
		// and recovery) in its engine; the middleware uses it.
		Operation: payments.Operation,
		Tenant: func(r *http.Request) (string, error) {
			if pr := paymentRequestOf(r.Context()); pr != nil && pr.tenant != "" {
				return pr.tenant, nil
			}
			return "", errors.New("payments: no authenticated tenant")
		},
		MaxBodyBytes: s.MaxBodyBytes(),
		MaxWait:      engine.DefaultMaxWait,
		Logger:       s.Logger(),
		Errors:       s.Errors(),
		Hooks: &idemhttp.Hooks{
			Command: func(r *http.Request, body []byte) (idemhttp.Command, error) {
				if ct := r.Header.Get("Content-Type"); ct != "" {
					if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
						return idemhttp.Command{}, idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json.")
					}
				}
				call, err := pay.Prepare(payments.Request{Body: body, APIVersion: r.Header.Get("Api-Version"), Uncertain: region.UncertainRoute(r.Context())})
				if err != nil {
					return idemhttp.Command{}, err
				}
				if pr := paymentRequestOf(r.Context()); pr != nil {
					pr.call = call
				}
				// The command is parsed only when the engine needs it: not
				// for a retry with the bytes of the answer it keeps. The
				// Content-Type above is checked on every request, so the
				// raw hash needs none.
				return idemhttp.Command{RawHash: call.RawHash(), Fingerprint: call.Hashes, Claim: call.Claim, Recover: call.Recover, Value: call}, nil
			},
			RetryOn: payments.CommitUnknown,
			Observe: func(r *http.Request, ans engine.Answer, err error, d time.Duration) {
				var unknown bool
				if pr := paymentRequestOf(r.Context()); pr != nil && pr.call != nil && !ans.Replayed {
					unknown = pr.call.Unknown()
					if pr.call.ProviderKeyConflict() {
						keyConflicts.Inc()
					}
				}
				s.Observe(payments.Operation, region.Observation{Outcome: ans.Outcome, Replayed: ans.Replayed, ExpiredRetry: ans.ExpiredRetry,
					Unknown: unknown}, err, d)
			},
		},
	})
	if err != nil {
		// Only a service without its engine operation gets here.
		return func(w http.ResponseWriter, r *http.Request, _ string) {
			s.WriteError(w, r, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: err})
		}
	}
	h := mw(http.HandlerFunc(handleCreatePayment))
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), paymentRequestKey{}, &paymentRequest{tenant: tenant})))
	}
}

// handleCreatePayment charges the payment its call's claim wrote, under the
// middleware's attempt, and answers what it recorded.
func handleCreatePayment(w http.ResponseWriter, r *http.Request) {
	call, _ := idemhttp.ValueFrom(r.Context()).(*payments.Call)
	a := idemhttp.AttemptFrom(r.Context())
	if call == nil || a == nil {
		idemhttp.Fail(w, &idem.Error{Code: idem.ECodeInternal, Message: "Internal error.", Err: errors.New("payments: payment handler outside the middleware")})
		return
	}
	res, err := call.Execute(r.Context(), a)
	idemhttp.Stored(w, res.Status)
	if err != nil {
		idemhttp.Fail(w, err)
		return
	}
	for k, v := range res.Response.Headers {
		w.Header().Set(k, v)
	}
	w.WriteHeader(res.Response.Status)
	_, _ = w.Write(res.Response.Body)
}

// getPayment is GET /payments/{id}: the tenant's payment as it is now.
func getPayment(s *region.Server, pay *payments.Service, w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if !validPaymentID(id) {
		// No payment has such an id; PostgreSQL would refuse it (NUL,
		// invalid UTF-8) with an error that is not the client's to see.
		s.WriteError(w, r, idem.Errorf(payments.ECodePaymentNotFound, "No such payment."))
		return
	}
	body, err := pay.Get(r.Context(), tenant, id)
	if err != nil {
		s.WriteError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// maxPaymentIDLen bounds the {id} of GET /payments/{id}.
const maxPaymentIDLen = 128

// validPaymentID reports whether id could name a payment: 1 to
// maxPaymentIDLen visible ASCII characters (ids are "pay_" and hex digits).
func validPaymentID(id string) bool {
	if id == "" || len(id) > maxPaymentIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

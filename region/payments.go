package region

import (
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/payments"
)

// Payments is the reference operation, create_payment, as one of a node's
// operations: POST /payments and GET /payments/{id}, its engine operation
// (recovery asks the provider before it charges again) and its recovery
// outcomes. It is registered like any other operation.
func Payments(pay *payments.Service) Operation {
	op := pay.EngineOperation()
	return Operation{
		Name: payments.Operation,
		Routes: func(s *Server) []Route {
			return []Route{
				{"POST /payments", func(w http.ResponseWriter, r *http.Request, tenant string) { s.handleCreatePayment(pay, w, r, tenant) }},
				{"GET /payments/{id}", func(w http.ResponseWriter, r *http.Request, tenant string) { s.handleGetPayment(pay, w, r, tenant) }},
			}
		},
		Engine:           &op,
		RecoveryOutcomes: payments.RecoveryOutcomes,
	}
}

func (s *Server) handleCreatePayment(pay *payments.Service, w http.ResponseWriter, r *http.Request, tenant string) {
	start := time.Now()
	key, keyPresent := r.Header["Idempotency-Key"]
	switch {
	case !keyPresent:
		writeError(w, r, s.logger, idem.Errorf(idem.ECodeKeyMissing, "The Idempotency-Key header is required."))
		return
	case len(key) != 1 || !idem.ValidKey(key[0]):
		writeError(w, r, s.logger, idem.Errorf(idem.ECodeKeyInvalid, "The Idempotency-Key header must be 1 to 255 visible ASCII characters."))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json."))
			return
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	res, err := pay.Create(r.Context(), payments.Request{
		Tenant: tenant, Key: key[0], Body: body, APIVersion: r.Header.Get("Api-Version"), Wait: preferWait(r.Header),
		Uncertain: routeOf(r.Context()).Uncertain,
	})
	s.observe(payments.Operation, res, err, time.Since(start))
	window := strconv.FormatInt(int64(pay.Window()/time.Second), 10)
	w.Header().Set("Idempotency-Window", window)
	if err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	for k, v := range res.Response.Headers {
		w.Header().Set(k, v)
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(res.Response.Status)
	_, _ = w.Write(res.Response.Body)
}

// observe counts an idempotent request's outcome.
func (s *Server) observe(operation string, res payments.Result, err error, d time.Duration) {
	outcome := outcomeLabel(res.Outcome)
	switch idem.ErrorCode(err) {
	case "":
	case idem.ECodeKeyReused:
		outcome = idem.OutcomeConflict.String()
		s.metrics.conflicts.WithLabelValues(operation).Inc()
	case idem.ECodeInProgress:
		outcome = idem.OutcomeInProgress.String()
		s.metrics.inProgress.WithLabelValues(operation).Inc()
	default:
		if res.Outcome == 0 {
			outcome = outcomeRejected
		}
	}
	if res.Replayed {
		s.metrics.replays.WithLabelValues(operation).Inc()
	}
	if res.ExpiredRetry {
		s.metrics.expiredRetries.WithLabelValues(operation).Inc()
	}
	if res.Unknown {
		s.metrics.unknownStates.WithLabelValues(operation).Inc()
	}
	if res.ProviderKeyConflict {
		s.metrics.keyConflicts.Inc()
	}
	s.metrics.requests.WithLabelValues(operation, outcome).Inc()
	s.metrics.latency.WithLabelValues(operation, outcome).Observe(d.Seconds())
}

func (s *Server) handleGetPayment(pay *payments.Service, w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if !validPaymentID(id) {
		// No payment has such an id; PostgreSQL would refuse it (NUL,
		// invalid UTF-8) with an error that is not the client's to see.
		writeError(w, r, s.logger, idem.Errorf(payments.ECodePaymentNotFound, "No such payment."))
		return
	}
	body, err := pay.Get(r.Context(), tenant, id)
	if err != nil {
		writeError(w, r, s.logger, err)
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
	return id != "" && len(id) <= maxPaymentIDLen && visibleASCII(id)
}

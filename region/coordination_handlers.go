package region

import (
	"context"
	"net/http"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/fingerprint"
)

func (s *Server) handleCoordBegin(w http.ResponseWriter, r *http.Request, tenant string) {
	start := time.Now()
	scope, err := s.coordScope(r, tenant)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	d, err := s.coordBegin(w, r, scope)
	s.observeCoordination(scope.Operation, d, err, time.Since(start))
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	out := coordapi.BeginAnswer{Outcome: d.Outcome.String(), FencingToken: d.Lease.Token, ExpiredRetry: d.ExpiredRetry, Record: &coordapi.Record{}}
	if d.Record != nil {
		out.Record = viewOf(d.Record)
		if d.Outcome == idem.OutcomeReplay {
			out.Response = coordResponseOf(d.Record.Response)
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	if d.Outcome == idem.OutcomeInProgress {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) coordBegin(w http.ResponseWriter, r *http.Request, scope idem.Scope) (idem.Decision, error) {
	var in coordapi.BeginRequest
	if err := s.decodeCoordBody(w, r, &in); err != nil {
		return idem.Decision{}, err
	}
	req := idem.BeginRequest{
		Scope:      scope,
		Owner:      "coord/" + scope.Tenant,
		HomeRegion: s.cfg.Region,
		LockFor:    defaultLockTimeout,
		Window:     s.window,
	}
	switch {
	case in.RequestHash != nil && len(in.Command) > 0:
		return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Send either requestHash or command, not both.")
	case in.RequestHash != nil:
		version, ok := parseRequestHash(*in.RequestHash)
		if !ok {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed,
				"Field \"requestHash\" must be \"v<version>:<hash>\", at most %d visible ASCII characters.", maxRequestHashLen)
		}
		// A v2 hash also stands for the v1 hash of the same bytes, so a
		// caller's retry after the version change still meets its v1 record.
		req.RequestHashes, req.HashVersion = fingerprint.Equivalent(*in.RequestHash), version
	case len(in.Command) > 0:
		hashes, err := commandHashes(scope.Operation, in.Command)
		if err != nil {
			return idem.Decision{}, err
		}
		req.RequestHashes, req.HashVersion = hashes, fingerprint.Version
	default:
		return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Send requestHash or command.")
	}
	if in.LockTimeoutSeconds != nil {
		if *in.LockTimeoutSeconds < 1 || *in.LockTimeoutSeconds > int64(maxLockTimeout/time.Second) {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"lockTimeoutSeconds\" must be 1 to %d.", int64(maxLockTimeout/time.Second))
		}
		req.LockFor = time.Duration(*in.LockTimeoutSeconds) * time.Second
	}
	if in.WindowSeconds != nil {
		if *in.WindowSeconds < 1 || *in.WindowSeconds > int64(maxWindow/time.Second) {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "Field \"windowSeconds\" must be 1 to %d.", int64(maxWindow/time.Second))
		}
		req.Window = time.Duration(*in.WindowSeconds) * time.Second
	}
	if in.Owner != nil && *in.Owner != "" {
		if err := checkText("owner", *in.Owner, maxOwnerLen); err != nil {
			return idem.Decision{}, err
		}
		req.Owner = *in.Owner
	}
	if in.ClaimID != nil {
		if c := *in.ClaimID; len(c) < minClaimIDLen || len(c) > maxClaimIDLen || !visibleASCII(c) {
			return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed,
				"Field \"claimId\" must be %d to %d visible ASCII characters.", minClaimIDLen, maxClaimIDLen)
		}
		req.ClaimID = *in.ClaimID
	}
	return s.begin(r.Context(), req)
}

// begin claims for the coordination API: through the node's engine, whose
// answer cache replays (or refuses) a settled record it holds with no store
// round trip (engine.Engine.Begin), when the engine runs over this node's
// store; through the store otherwise.
func (s *Server) begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	if s.engine.Coordinator() == idem.Coordinator(s.store) {
		return s.engine.Begin(ctx, req)
	}
	return s.store.Begin(ctx, req)
}

func (s *Server) handleCoordCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) {
	var in coordapi.CheckpointRequest
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	if err == nil {
		switch {
		case in.Checkpoint == nil || *in.Checkpoint == "":
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"checkpoint\" is required.")
		case len(*in.Checkpoint) > maxCheckpointLen || !visibleASCII(*in.Checkpoint):
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"checkpoint\" must be 1 to %d visible ASCII characters.", maxCheckpointLen)
		default:
			err = s.store.Checkpoint(r.Context(), lease, idem.Checkpoint(*in.Checkpoint))
		}
	}
	s.coordNoContent(w, r, err)
}

func (s *Server) handleCoordComplete(w http.ResponseWriter, r *http.Request, tenant string) {
	var in coordapi.CompleteRequest
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	if err == nil {
		var resp *idem.Response
		switch {
		case in.Response == nil:
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"response\" is required.")
		default:
			if resp, err = responseFrom(in.Response); err == nil {
				if err = checkText("resourceType", in.ResourceType, maxResourceTypeLen); err == nil {
					err = checkText("resourceId", in.ResourceID, maxResourceIDLen)
				}
			}
		}
		if err == nil {
			err = s.store.Complete(r.Context(), lease, idem.Completion{Response: *resp, ResourceType: in.ResourceType, ResourceID: in.ResourceID})
		}
	}
	s.coordNoContent(w, r, err)
}

func (s *Server) handleCoordFail(w http.ResponseWriter, r *http.Request, tenant string) {
	var in coordapi.FailRequest
	lease, err := s.coordLease(w, r, tenant, &in, func() *int64 { return in.FencingToken })
	var f idem.Failure
	if err == nil {
		switch {
		case in.Status == nil:
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"status\" is required.")
		case *in.Status != string(idem.StatusFailedReplayable) && *in.Status != string(idem.StatusFailedRetryable) && *in.Status != string(idem.StatusUnknown):
			err = idem.Errorf(idem.ECodeValidationFailed, "Field \"status\" must be %s, %s or %s.",
				idem.StatusFailedReplayable, idem.StatusFailedRetryable, idem.StatusUnknown)
		default:
			f = idem.Failure{Status: idem.Status(*in.Status), ErrorCode: in.ErrorCode}
			err = checkText("errorCode", in.ErrorCode, maxErrorCodeLen)
			if err == nil && in.Response != nil {
				f.Response, err = responseFrom(in.Response)
			}
		}
		if err == nil {
			err = s.store.Fail(r.Context(), lease, f)
		}
		if err == nil && f.Status == idem.StatusUnknown {
			s.metrics.unknownStates.WithLabelValues(lease.Operation).Inc()
		}
	}
	s.coordNoContent(w, r, err)
}

// handleCoordGet shows the caller's own record with its stored response.
// Another tenant's key is indistinguishable from an absent one.
func (s *Server) handleCoordGet(w http.ResponseWriter, r *http.Request, tenant string) {
	scope, err := s.coordScope(r, tenant)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	rec, err := s.store.Get(r.Context(), scope)
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, coordapi.RecordAnswer{Record: viewOf(rec), Response: coordResponseOf(rec.Response)})
}

func (s *Server) coordFail(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Cache-Control", "no-store")
	s.writeError(w, r, err)
}

func (s *Server) coordNoContent(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		s.coordFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// observeCoordination counts a begin like a request of the node's own operations.
// Only begins of a declared operation (Config.Operations) get here, so no
// label value comes from a request.
func (s *Server) observeCoordination(operation string, d idem.Decision, err error, elapsed time.Duration) {
	outcome := refusedLabel(err)
	if err == nil {
		outcome = outcomeLabel(d.Outcome)
		switch d.Outcome {
		case idem.OutcomeReplay:
			s.metrics.replays.WithLabelValues(operation).Inc()
		case idem.OutcomeConflict:
			s.metrics.conflicts.WithLabelValues(operation).Inc()
		case idem.OutcomeInProgress:
			s.metrics.inProgress.WithLabelValues(operation).Inc()
		}
		if d.ExpiredRetry {
			s.metrics.expiredRetries.WithLabelValues(operation).Inc()
		}
	}
	s.metrics.requests.WithLabelValues(operation, outcome).Inc()
	s.metrics.latency.WithLabelValues(operation, outcome).Observe(elapsed.Seconds())
}

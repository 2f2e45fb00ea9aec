package coordclient_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/memcoord"
)

// startStandInNode serves the coordination API (paths under
// /v1/coordination, bodies of package coordapi) over an in-memory
// coordinator, for the Example: the part of a regional node (idemd, over
// PostgreSQL) that the client talks to, and nothing else. The bearer token
// "secret-token" is tenant acme. It checks less than a node does (no
// limits on lock times, windows or field sizes, no strict decoding) and
// keeps no metrics; the tests of this package run the client against a
// real node.
func startStandInNode() *httptest.Server {
	c := memcoord.New()
	mux := http.NewServeMux()
	lease := func(r *http.Request, tenant string, token *int64) idem.Lease {
		l := idem.Lease{Scope: idem.Scope{Tenant: tenant, Operation: r.PathValue("operation"), Key: r.PathValue("key")}}
		if token != nil {
			l.Token = *token
		}
		return l
	}
	handle := func(pattern string, h func(r *http.Request, tenant string) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer secret-token" {
				writeJSON(w, http.StatusUnauthorized, coordapi.Error{ErrorCode: idem.ECodeUnauthenticated, Message: "Unknown token."})
				return
			}
			out, err := h(r, "acme")
			switch {
			case err != nil:
				status := http.StatusBadRequest
				switch {
				case errors.Is(err, idem.ErrFenced):
					status = http.StatusConflict
				case errors.Is(err, idem.ErrRecordNotFound):
					status = http.StatusNotFound
				}
				writeJSON(w, status, coordapi.Error{ErrorCode: idem.ErrorCode(err), Message: idem.ErrorMessage(err)})
			case out == nil:
				w.WriteHeader(http.StatusNoContent)
			default:
				writeJSON(w, http.StatusOK, out)
			}
		})
	}
	handle("POST /v1/coordination/{operation}/{key}/begin", func(r *http.Request, tenant string) (any, error) {
		var in coordapi.BeginRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.RequestHash == nil || in.LockTimeoutSeconds == nil || in.WindowSeconds == nil {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "This stand-in needs requestHash, lockTimeoutSeconds and windowSeconds.")
		}
		req := idem.BeginRequest{Scope: lease(r, tenant, nil).Scope, RequestHashes: fingerprint.Equivalent(*in.RequestHash),
			HashVersion: fingerprint.VersionOf(*in.RequestHash), Owner: "coord/" + tenant, HomeRegion: "local",
			LockFor: time.Duration(*in.LockTimeoutSeconds) * time.Second, Window: time.Duration(*in.WindowSeconds) * time.Second}
		if in.Owner != nil {
			req.Owner = *in.Owner
		}
		d, err := c.Begin(r.Context(), req)
		if err != nil {
			return nil, err
		}
		out := coordapi.BeginAnswer{Outcome: d.Outcome.String(), FencingToken: d.Lease.Token, ExpiredRetry: d.ExpiredRetry, Record: wireRecord(d.Record)}
		if d.Outcome == idem.OutcomeReplay {
			out.Response = wireResponse(d.Record.Response)
		}
		return out, nil
	})
	handle("POST /v1/coordination/{operation}/{key}/checkpoint", func(r *http.Request, tenant string) (any, error) {
		var in coordapi.CheckpointRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Checkpoint == nil {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "Send fencingToken and checkpoint.")
		}
		return nil, c.Checkpoint(r.Context(), lease(r, tenant, in.FencingToken), idem.Checkpoint(*in.Checkpoint))
	})
	handle("POST /v1/coordination/{operation}/{key}/complete", func(r *http.Request, tenant string) (any, error) {
		var in coordapi.CompleteRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Response == nil || in.Response.Status == nil {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "Send fencingToken and response.")
		}
		return nil, c.Complete(r.Context(), lease(r, tenant, in.FencingToken), idem.Completion{
			Response: *responseOf(in.Response), ResourceType: in.ResourceType, ResourceID: in.ResourceID})
	})
	handle("POST /v1/coordination/{operation}/{key}/fail", func(r *http.Request, tenant string) (any, error) {
		var in coordapi.FailRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Status == nil {
			return nil, idem.Errorf(idem.ECodeValidationFailed, "Send fencingToken and status.")
		}
		return nil, c.Fail(r.Context(), lease(r, tenant, in.FencingToken), idem.Failure{
			Status: idem.Status(*in.Status), ErrorCode: in.ErrorCode, Response: responseOf(in.Response)})
	})
	handle("GET /v1/coordination/{operation}/{key}", func(r *http.Request, tenant string) (any, error) {
		rec, err := c.Get(r.Context(), lease(r, tenant, nil).Scope)
		if err != nil {
			return nil, err
		}
		return coordapi.RecordAnswer{Record: wireRecord(rec), Response: wireResponse(rec.Response)}, nil
	})
	return httptest.NewServer(mux)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func responseOf(in *coordapi.ResponseInput) *idem.Response {
	if in == nil || in.Status == nil {
		return nil
	}
	return &idem.Response{Status: *in.Status, Headers: in.Headers, Body: in.Body, SchemaVersion: in.SchemaVersion}
}

func wireResponse(r *idem.Response) *coordapi.Response {
	if r == nil {
		return nil
	}
	out := &coordapi.Response{Status: r.Status, Headers: r.Headers, Body: r.Body, SchemaVersion: r.SchemaVersion}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	return out
}

func wireRecord(rec *idem.Record) *coordapi.Record {
	v := &coordapi.Record{
		Operation: rec.Operation, Key: rec.Key, Status: string(rec.Status), Checkpoint: string(rec.Checkpoint),
		RequestHash: rec.RequestHash, HashVersion: rec.HashVersion, Owner: rec.Owner, FencingToken: rec.FencingToken,
		LockedUntil: rec.LockedUntil, Attempts: rec.Attempts, Generation: rec.Generation,
		ResourceType: rec.ResourceType, ResourceID: rec.ResourceID, ErrorCode: rec.ErrorCode, HomeRegion: rec.HomeRegion,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt, ExpiresAt: rec.ExpiresAt,
	}
	if rec.Response != nil {
		v.ResponseStatus, v.ResponseSchemaVersion = rec.Response.Status, rec.Response.SchemaVersion
	}
	return v
}

// Package coordclient is the Go client of a regional node's coordination API
// (POST /v1/coordination/{operation}/{key}/begin, .../checkpoint, .../complete,
// .../fail and GET /v1/coordination/{operation}/{key}; see
// docs/openapi.yaml; the bodies are package coordapi's).
//
// *Client satisfies idem.Coordinator, so a Go service can switch between the
// in-process engine (*store.Store) and a remote node without other changes.
// The differences a caller can see:
//
//   - The tenant is the bearer token's. BeginRequest.Tenant and Scope.Tenant
//     are ignored when talking to the node; the Lease and Record the client
//     returns echo the caller's value so that Lease.Scope equals the scope it
//     asked for, but they say nothing about what the node decided.
//   - Only RequestHashes[0] is sent (as requestHash); the node derives the
//     hash version from its "v<N>:" prefix, so BeginRequest.HashVersion is not
//     sent either. A v2 hash also matches a record stored under v1 for the
//     same command (fingerprint.Equivalent); only where v1 was lossy (integers
//     beyond 2^53) can the two versions disagree.
//   - LockFor and Window travel as whole seconds, rounded up; the node
//     accepts 1s-1h and 1s-30d. BeginRequest.HomeRegion is the node's region.
//     An empty Owner becomes "coord/<tenant>".
//   - Decision.Record.Response is filled only on OutcomeReplay (and by Get),
//     where the node sends the stored response.
//   - Errors are *idem.Error with the node's code, so errors.Is(err,
//     idem.ErrFenced) and errors.Is(err, idem.ErrRecordNotFound) work as with
//     the engine. A request that did not get an answer from the node (network
//     failure, cancelled context, a proxy's non-JSON 5xx) is
//     *idem.Error{Code: idem.ECodeUnavailable} wrapping the cause; after such an
//     error on Begin the node may have granted a lease the caller never saw.
//     BeginRequest.ClaimID travels as claimId: a Begin sent again with the
//     same one is handed that lease (the engine draws one per request, so
//     engine.Request.RetryOn reporting ECodeUnavailable gets it back);
//     without one, a later Begin reports the key in progress until the lock
//     times out. The node refuses a claim id shorter than 16 characters.
package coordclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
)

// maxAnswerBytes bounds what the client reads from one answer.
const maxAnswerBytes = 4 << 20

// Client calls a node's coordination API. The zero value is not usable: set
// BaseURL and Token. It is safe for concurrent use.
type Client struct {
	// BaseURL is the node's URL, e.g. "https://eu.idem.example"; a path
	// prefix is kept.
	BaseURL string
	// Token is the bearer token; it decides the tenant.
	Token string
	// HTTP sends the requests. Default http.DefaultClient. Timeouts come from
	// it and from each call's context.
	HTTP *http.Client
}

var _ idem.Coordinator = (*Client)(nil)

var outcomes = map[string]idem.Outcome{
	idem.OutcomeExecute.String():    idem.OutcomeExecute,
	idem.OutcomeReplay.String():     idem.OutcomeReplay,
	idem.OutcomeConflict.String():   idem.OutcomeConflict,
	idem.OutcomeInProgress.String(): idem.OutcomeInProgress,
	idem.OutcomeRecover.String():    idem.OutcomeRecover,
	idem.OutcomeExpired.String():    idem.OutcomeExpired,
}

// --- idem.Coordinator ---

// Begin implements idem.Coordinator. req.Tenant and req.HashVersion are not
// sent (see the package documentation); RequestHashes[0] is.
func (c *Client) Begin(ctx context.Context, req idem.BeginRequest) (idem.Decision, error) {
	if err := checkScope(req.Scope); err != nil {
		return idem.Decision{}, err
	}
	if len(req.RequestHashes) == 0 || req.RequestHashes[0] == "" {
		return idem.Decision{}, idem.Errorf(idem.ECodeValidationFailed, "A request hash is required.")
	}
	var ans coordapi.BeginAnswer
	in := coordapi.BeginRequest{
		RequestHash:        &req.RequestHashes[0],
		LockTimeoutSeconds: ptr(ceilSeconds(req.LockFor)),
		WindowSeconds:      ptr(ceilSeconds(req.Window)),
	}
	if req.Owner != "" {
		in.Owner = &req.Owner
	}
	if req.ClaimID != "" {
		// The engine draws one per request (26 characters); the node
		// refuses one shorter than 16.
		in.ClaimID = &req.ClaimID
	}
	err := c.call(ctx, http.MethodPost, req.Scope, "/begin", in, &ans)
	if err != nil {
		return idem.Decision{}, err
	}
	outcome, ok := outcomes[ans.Outcome]
	if !ok || ans.Record == nil {
		return idem.Decision{}, protocolError(fmt.Errorf("begin answered outcome %q with record %v", ans.Outcome, ans.Record != nil))
	}
	rec := RecordOf(req.Tenant, ans.Record, ans.Response)
	d := idem.Decision{Outcome: outcome, Record: rec, ExpiredRetry: ans.ExpiredRetry}
	if ans.FencingToken > 0 {
		d.Lease = idem.Lease{Scope: req.Scope, Token: ans.FencingToken, Owner: rec.Owner}
	}
	return d, nil
}

// Checkpoint implements idem.Coordinator. Only lease's operation, key and
// token are sent.
func (c *Client) Checkpoint(ctx context.Context, lease idem.Lease, cp idem.Checkpoint) error {
	if err := checkScope(lease.Scope); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, lease.Scope, "/checkpoint", coordapi.CheckpointRequest{FencingToken: &lease.Token, Checkpoint: ptr(string(cp))}, nil)
}

// Complete implements idem.Coordinator.
func (c *Client) Complete(ctx context.Context, lease idem.Lease, done idem.Completion) error {
	if err := checkScope(lease.Scope); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, lease.Scope, "/complete", coordapi.CompleteRequest{
		FencingToken: &lease.Token, Response: wireOf(&done.Response),
		ResourceType: done.ResourceType, ResourceID: done.ResourceID,
	}, nil)
}

// Fail implements idem.Coordinator.
func (c *Client) Fail(ctx context.Context, lease idem.Lease, f idem.Failure) error {
	if err := checkScope(lease.Scope); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, lease.Scope, "/fail", coordapi.FailRequest{
		FencingToken: &lease.Token, Status: ptr(string(f.Status)), ErrorCode: f.ErrorCode, Response: wireOf(f.Response),
	}, nil)
}

// Get implements idem.Coordinator: the record of scope (in the token's
// tenant) with its stored response, or an error matching idem.ErrRecordNotFound.
func (c *Client) Get(ctx context.Context, scope idem.Scope) (*idem.Record, error) {
	if err := checkScope(scope); err != nil {
		return nil, err
	}
	var ans coordapi.RecordAnswer
	if err := c.call(ctx, http.MethodGet, scope, "", nil, &ans); err != nil {
		return nil, err
	}
	if ans.Record == nil {
		return nil, protocolError(errors.New("record answer without a record"))
	}
	return RecordOf(scope.Tenant, ans.Record, ans.Response), nil
}

// --- plumbing ---

// checkScope refuses locally, before any request, what the node would
// refuse: an operation that is not idem.ValidOperation (REQUEST_VALIDATION_FAILED)
// and a key that is not idem.ValidKey (IDEMPOTENCY_KEY_INVALID), which
// includes the keys "." and ".." that no URL path can carry reliably. Every
// key and operation it lets through is one path segment once escaped
// (segment), which the node reads back unchanged.
func checkScope(s idem.Scope) error {
	if !idem.ValidOperation(s.Operation) {
		return idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-', other than \".\" and \"..\".", idem.MaxOperationLen)
	}
	if !idem.ValidKey(s.Key) {
		return idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters, other than \".\" and \"..\".")
	}
	return nil
}

// segment escapes one path segment: "/", "?", "#", "%" and the like are
// percent-encoded. checkScope has refused "." and "..", the only segments
// a path cleaner would still resolve.
func segment(s string) string { return url.PathEscape(s) }

func (c *Client) call(ctx context.Context, method string, scope idem.Scope, suffix string, in, out any) error {
	target := strings.TrimRight(c.BaseURL, "/") + "/v1/coordination/" + segment(scope.Operation) + "/" + segment(scope.Key) + suffix
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return &idem.Error{Code: idem.ECodeValidationFailed, Message: "The request cannot be encoded as JSON.", Err: err}
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return &idem.Error{Code: idem.ECodeInternal, Message: "The coordination request cannot be built.", Err: fmt.Errorf("coordclient: %w", err)}
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return unavailable(fmt.Errorf("coordclient: %s %s: %w", method, req.URL.Path, err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return unavailable(fmt.Errorf("coordclient: %s %s: read answer: %w", method, req.URL.Path, err))
	}
	if len(raw) > maxAnswerBytes {
		return protocolError(fmt.Errorf("%s %s: answer larger than %d bytes", method, req.URL.Path, maxAnswerBytes))
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return protocolError(fmt.Errorf("%s %s: decode %d answer: %w", method, req.URL.Path, resp.StatusCode, err))
		}
		return nil
	}
	cause := fmt.Errorf("coordclient: %s %s: HTTP %d", method, req.URL.Path, resp.StatusCode)
	var e coordapi.Error
	if json.Unmarshal(raw, &e) == nil && e.ErrorCode != "" {
		return &idem.Error{Code: e.ErrorCode, Message: e.Message, Err: cause}
	}
	// Not the node's error contract: a proxy or load balancer answered.
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return unavailable(cause)
	}
	return protocolError(cause)
}

func unavailable(err error) error {
	return &idem.Error{Code: idem.ECodeUnavailable, Message: "The coordination node could not be reached; retry with the same key.", Err: err}
}

func protocolError(err error) error {
	return &idem.Error{Code: idem.ECodeInternal, Message: "The coordination node gave an unexpected answer.", Err: fmt.Errorf("coordclient: %w", err)}
}

// ceilSeconds rounds d up to whole seconds (0 for d <= 0, which the node
// rejects as the engine does).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func ptr[T any](v T) *T { return &v }

func wireOf(r *idem.Response) *coordapi.ResponseInput {
	if r == nil {
		return nil
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	return &coordapi.ResponseInput{Status: &r.Status, Headers: r.Headers, Body: body, SchemaVersion: r.SchemaVersion}
}

// RecordOf is the record a node sent (w, and its stored response resp when
// it sent one; nil leaves the record without a response), in tenant's
// scope: the node never sends the tenant, which is the caller's.
func RecordOf(tenant string, w *coordapi.Record, resp *coordapi.Response) *idem.Record {
	r := &idem.Record{
		Scope:       idem.Scope{Tenant: tenant, Operation: w.Operation, Key: w.Key},
		RequestHash: w.RequestHash, HashVersion: w.HashVersion,
		Status: idem.Status(w.Status), Checkpoint: idem.Checkpoint(w.Checkpoint),
		Owner: w.Owner, FencingToken: w.FencingToken, LockedUntil: w.LockedUntil,
		Attempts: w.Attempts, Generation: w.Generation,
		ResourceType: w.ResourceType, ResourceID: w.ResourceID, ErrorCode: w.ErrorCode, HomeRegion: w.HomeRegion,
		CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt, ExpiresAt: w.ExpiresAt,
	}
	if resp != nil {
		r.Response = &idem.Response{Status: resp.Status, Headers: resp.Headers, Body: resp.Body, SchemaVersion: resp.SchemaVersion}
		if len(r.Response.Headers) == 0 {
			r.Response.Headers = nil
		}
	}
	return r
}

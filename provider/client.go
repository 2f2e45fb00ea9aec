package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/idemcoord/idem/internal/telemetry"
)

// Sentinel errors returned (wrapped) by [Client]. Test them with errors.Is;
// use errors.As with [*APIError] for the status and error code of an answer.
var (
	// ErrDeclined: the provider rejected the payment (402). Nothing was
	// charged, and a retry with the same key is declined again.
	ErrDeclined = errors.New("provider: payment declined")
	// ErrNotFound: no charge exists for the provider key (404).
	ErrNotFound = errors.New("provider: charge not found")
	// ErrUnavailable: the provider answered 5xx or 429, or the request never
	// left the client (dial failure, context done before sending).
	// Definitely nothing was charged; retrying is safe.
	ErrUnavailable = errors.New("provider: unavailable, nothing charged")
	// ErrStaleToken: the fencing token was lower than the highest the
	// provider has seen for the key (409 FENCING_TOKEN_STALE). Nothing was
	// charged; the caller has lost its lease.
	ErrStaleToken = errors.New("provider: stale fencing token")
	// ErrKeyReused: the provider key was already used with a different
	// amount or currency (409 PROVIDER_KEY_REUSED).
	ErrKeyReused = errors.New("provider: provider key reused with different parameters")
	// ErrUnauthorized: the provider refused the key (401 or 403): a
	// configuration error. Nothing was charged, and such an answer also
	// matches ErrUnavailable.
	ErrUnauthorized = errors.New("provider: key refused, nothing charged")
	// ErrBadRequest: the provider rejected the request as malformed (400).
	ErrBadRequest = errors.New("provider: bad request")
	// ErrAmbiguous: the request was sent but no usable answer came back
	// (connection dropped or reset, EOF, client timeout, context done after
	// sending, unreadable success body). It may or may not have been
	// applied: reconcile with [Client.Lookup] or retry with the same key.
	// The underlying error is wrapped too.
	ErrAmbiguous = errors.New("provider: outcome unknown, the request may have been applied")
)

// APIError is an error answer of the provider. It unwraps to the sentinel
// error of its class (for example [ErrDeclined]), if any.
type APIError struct {
	// Op describes the call, for example "charge provider_payment_p1".
	Op string
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Code is the errorCode of the body, for example "PAYMENT_DECLINED";
	// empty if the body was not a provider error.
	Code string
	// Message is the message of the body.
	Message string
	// Replayed reports an Idempotent-Replayed: true answer (a remembered
	// decline).
	Replayed bool

	kind error
}

// Error implements error.
func (e *APIError) Error() string {
	return fmt.Sprintf("provider: %s: %d %s: %s", e.Op, e.StatusCode, e.Code, e.Message)
}

// Unwrap returns the sentinel error of the answer's class, or nil.
func (e *APIError) Unwrap() error { return e.kind }

// errRefusedKey is the class of a refused key: nothing was charged, so it is
// ErrUnavailable too.
var errRefusedKey = fmt.Errorf("%w (%w)", ErrUnauthorized, ErrUnavailable)

// classify maps an error answer to its sentinel.
func classify(status int, code string) error {
	switch {
	case status == http.StatusBadRequest:
		return ErrBadRequest
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return errRefusedKey
	case status == http.StatusPaymentRequired:
		return ErrDeclined
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusConflict && code == CodeFencingTokenStale:
		return ErrStaleToken
	case status == http.StatusConflict && code == CodeKeyReused:
		return ErrKeyReused
	case status == http.StatusTooManyRequests, status >= 500 && status <= 599:
		return ErrUnavailable
	}
	return nil
}

// ChargeRequest is a charge to ask of the provider.
type ChargeRequest struct {
	// ProviderKey is sent as Idempotency-Key; see [ProviderKeyFor].
	ProviderKey string
	AmountMinor int64
	Currency    string
	AccountID   string
	// FencingToken is sent as Idem-Fencing-Token; 0 sends no header.
	FencingToken int64
	// Reference is kept with the charge (ChargeBody.Reference): a replay
	// or a Lookup of the key returns the reference of the request that
	// made the charge.
	Reference string
}

// Client talks to a provider over HTTP. The zero value is not usable: set
// BaseURL. Client never retries on its own (it also stops net/http from
// transparently re-sending a charge on a reused connection), so that every
// [ErrAmbiguous] reaches the caller.
type Client struct {
	// BaseURL is the provider's root, for example "http://127.0.0.1:8090".
	BaseURL string
	// HTTP is the client used for requests; nil means http.DefaultClient.
	// Its Timeout, if any, bounds each call (a timeout after sending is
	// ErrAmbiguous).
	HTTP *http.Client
	// APIKey is sent as "Authorization: Bearer <APIKey>" on charges and
	// lookups; empty sends none.
	APIKey string
	// AdminKey is sent the same way on the /admin endpoints (SetFault,
	// Fault, Charges); empty sends none.
	AdminKey string
}

// Charge asks the provider to charge req. On success the charge is returned
// with Replayed set if the key had already charged. Errors wrap one of the
// sentinels above (ErrDeclined, ErrStaleToken, ErrKeyReused, ErrBadRequest,
// ErrUnavailable, ErrAmbiguous).
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	op := "charge " + req.ProviderKey
	hdr := http.Header{}
	hdr.Set(HeaderIdempotencyKey, req.ProviderKey)
	if req.FencingToken != 0 {
		hdr.Set(HeaderFencingToken, strconv.FormatInt(req.FencingToken, 10))
	}
	body := ChargeBody{AmountMinor: req.AmountMinor, Currency: req.Currency, AccountID: req.AccountID, Reference: req.Reference}
	resp, err := c.do(ctx, op, http.MethodPost, "/v1/charges", hdr, body)
	if err != nil {
		return Charge{}, err
	}
	if resp.status != http.StatusOK && resp.status != http.StatusCreated {
		return Charge{}, resp.apiError(op)
	}
	// The provider answered success: the charge is applied, but if we
	// cannot read which charge, the caller must reconcile.
	if resp.bodyErr != nil {
		return Charge{}, fmt.Errorf("provider: %s: reading %d answer: %w: %w", op, resp.status, ErrAmbiguous, resp.bodyErr)
	}
	var ch Charge
	if err := json.Unmarshal(resp.body, &ch); err != nil {
		return Charge{}, fmt.Errorf("provider: %s: decoding %d answer: %w: %w", op, resp.status, ErrAmbiguous, err)
	}
	ch.Replayed = resp.header.Get(HeaderReplayed) == "true"
	return ch, nil
}

// Lookup returns the charge applied for providerKey, or an error wrapping
// [ErrNotFound] if the provider never charged it (declined keys included).
func (c *Client) Lookup(ctx context.Context, providerKey string) (Charge, error) {
	op := "lookup " + providerKey
	var ch Charge
	if err := c.getJSON(ctx, op, "/v1/charges/"+url.PathEscape(providerKey), &ch); err != nil {
		return Charge{}, err
	}
	return ch, nil
}

// SetFault replaces the provider's active fault (PUT /admin/fault).
func (c *Client) SetFault(ctx context.Context, f Fault) error {
	op := "set fault"
	resp, err := c.do(ctx, op, http.MethodPut, "/admin/fault", nil, f)
	if err != nil {
		return err
	}
	if resp.status != http.StatusOK {
		return resp.apiError(op)
	}
	return nil
}

// Fault returns the provider's active fault (GET /admin/fault), with the
// remaining Times.
func (c *Client) Fault(ctx context.Context) (Fault, error) {
	var f Fault
	if err := c.getJSON(ctx, "get fault", "/admin/fault", &f); err != nil {
		return Fault{}, err
	}
	return f, nil
}

// Charges returns how many charges the provider applied (GET /admin/charges).
func (c *Client) Charges(ctx context.Context) (ChargeCounts, error) {
	var cc ChargeCounts
	if err := c.getJSON(ctx, "charge counts", "/admin/charges", &cc); err != nil {
		return ChargeCounts{}, err
	}
	if cc.ByKey == nil {
		cc.ByKey = map[string]int{}
	}
	return cc, nil
}

// Healthy reports whether the provider answers GET /healthz with 200.
func (c *Client) Healthy(ctx context.Context) error {
	var v map[string]string
	return c.getJSON(ctx, "health", "/healthz", &v)
}

func (c *Client) getJSON(ctx context.Context, op, path string, v any) error {
	resp, err := c.do(ctx, op, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	if resp.status != http.StatusOK {
		return resp.apiError(op)
	}
	if resp.bodyErr != nil {
		return fmt.Errorf("provider: %s: reading answer: %w: %w", op, ErrAmbiguous, resp.bodyErr)
	}
	if err := json.Unmarshal(resp.body, v); err != nil {
		return fmt.Errorf("provider: %s: decoding answer: %w", op, err)
	}
	return nil
}

// response is an answer whose status line and headers arrived.
type response struct {
	status  int
	header  http.Header
	body    []byte
	bodyErr error // the body could not be read completely
}

// apiError turns an error answer into an *APIError.
func (r response) apiError(op string) error {
	var eb ErrorBody
	if r.bodyErr == nil {
		_ = json.Unmarshal(r.body, &eb) // a non-JSON body keeps the status class
	}
	if eb.Message == "" {
		eb.Message = strings.TrimSpace(string(r.body))
		if eb.Message == "" {
			eb.Message = http.StatusText(r.status)
		}
	}
	return &APIError{
		Op:         op,
		StatusCode: r.status,
		Code:       eb.ErrorCode,
		Message:    eb.Message,
		Replayed:   r.header.Get(HeaderReplayed) == "true",
		kind:       classify(r.status, eb.ErrorCode),
	}
}

// maxResponseBytes bounds answers read by the client.
const maxResponseBytes = 1 << 20

// do sends one request. A transport failure is classified by whether the
// request headers had been written: before that, nothing reached the
// provider (ErrUnavailable); after, the outcome is unknown (ErrAmbiguous).
func (c *Client) do(ctx context.Context, op, method, path string, hdr http.Header, body any) (response, error) {
	if c.BaseURL == "" {
		return response{}, fmt.Errorf("provider: %s: Client.BaseURL is empty", op)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return response{}, fmt.Errorf("provider: %s: encode body: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	var sent atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, strings.TrimRight(c.BaseURL, "/")+path, rd)
	if err != nil {
		return response{}, fmt.Errorf("provider: %s: build request: %w", op, err)
	}
	telemetry.Inject(ctx, req.Header)
	// Without GetBody the transport treats the request as not replayable
	// and never re-sends it by itself after a dropped connection (it would
	// otherwise, because of the Idempotency-Key header).
	req.GetBody = nil
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	key := c.APIKey
	if strings.HasPrefix(path, "/admin/") {
		key = c.AdminKey
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}

	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if !sent.Load() {
			return response{}, fmt.Errorf("provider: %s: request not sent: %w: %w", op, ErrUnavailable, err)
		}
		return response{}, fmt.Errorf("provider: %s: %w: %w", op, ErrAmbiguous, err)
	}
	defer resp.Body.Close()
	b, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	return response{status: resp.StatusCode, header: resp.Header, body: b, bodyErr: readErr}, nil
}

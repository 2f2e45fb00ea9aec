package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	stripewebhook "github.com/stripe/stripe-go/v84/webhook"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/ident"
)

// Kinds of webhook route (Route.Webhook).
const (
	// WebhookStandard receives Standard Webhooks (standardwebhooks.com,
	// as Svix and others send them): the key is the webhook-id header, and
	// webhook-signature signs the id, webhook-timestamp and the body with
	// one of the route's secrets ("whsec_" and base64). Verified with the
	// Standard Webhooks Go library.
	WebhookStandard = "standard"
	// WebhookStripe receives Stripe's events: the key is the event's "id"
	// (a body field), and Stripe-Signature signs its t= timestamp and the
	// body with one of the route's secrets ("whsec_..."). Verified with
	// stripe-go's webhook package. The event's pending_webhooks, which
	// changes between deliveries of one event, is left out of the
	// fingerprint.
	WebhookStripe = "stripe"
)

// DefaultWebhookTolerance is a webhook route's default
// Route.WebhookTolerance: 5 minutes, the default of both senders'
// libraries.
const DefaultWebhookTolerance = 5 * time.Minute

// MaxWebhookTolerance bounds Route.WebhookTolerance.
const MaxWebhookTolerance = time.Hour

// DefaultWebhookWindow is a webhook route's default Route.Window: 3 days,
// as long as Stripe retries an event (Svix's schedule, a common Standard
// Webhooks sender, ends about 28 hours after the first attempt), so a
// redelivery within the sender's retry horizon gets the first answer.
const DefaultWebhookWindow = 72 * time.Hour

// MaxWindow bounds Route.Window: 30 days.
const MaxWindow = 30 * 24 * time.Hour

// Reasons Options.Metrics counts refused webhook deliveries by
// (WebhookMetrics): no signature headers, headers that cannot be read,
// a signature that none of the route's secrets made, and a signed
// timestamp outside the route's tolerance.
var webhookReasons = []string{"unsigned", "malformed", "mismatch", "stale"}

// WebhookRejectReasons returns the reasons WebhookMetrics counts refused
// deliveries by.
func WebhookRejectReasons() []string { return slices.Clone(webhookReasons) }

// WebhookMetrics, implemented by an Options.Metrics (idemprom's does, as
// idem_sidecar_webhook_rejected_total{operation,reason}), counts the
// deliveries that webhook routes refuse with 401
// WEBHOOK_SIGNATURE_INVALID.
type WebhookMetrics interface {
	// WebhookRejections is called once per webhook route with its
	// operation and returns what counts its refused deliveries by reason
	// (one of WebhookRejectReasons()), concurrently. It may create every
	// series then.
	WebhookRejections(operation string) func(reason string)
}

// errWebhookSignature answers a delivery whose signature does not verify.
// It never says which check failed, nor quotes the request.
var errWebhookSignature = idem.Errorf(idem.ECodeWebhookSignatureInvalid,
	"The webhook signature is missing, does not verify with the route's secrets, or its timestamp is outside the route's tolerance.")

// webhookOption sets the route option name (webhook, webhook-secret-file,
// webhook-tenant or webhook-tolerance) to val.
func (rt *Route) webhookOption(name, val string) error {
	switch name {
	case "webhook":
		if rt.Webhook != "" {
			return errors.New("webhook given twice")
		}
		if val != WebhookStandard && val != WebhookStripe {
			return fmt.Errorf("webhook %q: want %s or %s", val, WebhookStandard, WebhookStripe)
		}
		rt.Webhook = val
	case "webhook-secret-file":
		if rt.WebhookSecretFile != "" {
			return errors.New("webhook-secret-file given twice")
		}
		if !validField(val) {
			return fmt.Errorf("webhook-secret-file %q: want a path of visible ASCII characters without ',' or ';'", val)
		}
		rt.WebhookSecretFile = val
	case "webhook-tenant":
		if rt.WebhookTenant != "" {
			return errors.New("webhook-tenant given twice")
		}
		if ident.CheckTenant(val) != nil {
			return fmt.Errorf("webhook-tenant %q: want a tenant name", val)
		}
		rt.WebhookTenant = val
	case "webhook-tolerance":
		d, err := time.ParseDuration(val)
		if err != nil || d < time.Second || d > MaxWebhookTolerance {
			return fmt.Errorf("webhook-tolerance %q: want a duration from 1s to %v", val, MaxWebhookTolerance)
		}
		rt.WebhookTolerance = d
	default:
		return fmt.Errorf("option %q: want webhook=standard|stripe, webhook-secret-file=PATH, webhook-tenant=TENANT or webhook-tolerance=DURATION", name)
	}
	return nil
}

// checkWebhook reports what makes rt's webhook options inconsistent: a
// webhook route needs its secret file and tenant, takes POST, and takes
// its key from the event (no key-field); the other webhook options need
// webhook=.
func (rt Route) checkWebhook() error {
	if rt.Webhook == "" {
		if rt.WebhookSecretFile != "" || rt.WebhookTenant != "" || rt.WebhookTolerance != 0 {
			return errors.New("webhook-secret-file, webhook-tenant and webhook-tolerance need webhook=standard|stripe")
		}
		return nil
	}
	switch {
	case rt.Webhook != WebhookStandard && rt.Webhook != WebhookStripe:
		return fmt.Errorf("webhook %q: want %s or %s", rt.Webhook, WebhookStandard, WebhookStripe)
	case rt.WebhookSecretFile == "":
		return errors.New("webhook: the route needs webhook-secret-file=PATH")
	case rt.WebhookTenant == "" || ident.CheckTenant(rt.WebhookTenant) != nil:
		return errors.New("webhook: the route needs webhook-tenant=TENANT, a tenant name")
	case rt.Method != http.MethodPost:
		return errors.New("webhook: senders POST their events; the route's method must be POST")
	case rt.KeyField != "" && (rt.Webhook != WebhookStripe || rt.KeyField != "/id"):
		// A Stripe route's key is its body's /id (Route.served).
		return errors.New("webhook: the key is the event's id; key-field does not apply")
	case rt.WebhookTolerance < 0 || rt.WebhookTolerance > MaxWebhookTolerance:
		return fmt.Errorf("webhook-tolerance: want a duration from 1s to %v", MaxWebhookTolerance)
	}
	return nil
}

// webhookString is rt's webhook options in the route syntax.
func (rt Route) webhookString() string {
	if rt.Webhook == "" {
		return ""
	}
	s := ";webhook=" + rt.Webhook + ";webhook-secret-file=" + rt.WebhookSecretFile + ";webhook-tenant=" + rt.WebhookTenant
	if rt.WebhookTolerance != 0 {
		s += ";webhook-tolerance=" + rt.WebhookTolerance.String()
	}
	return s
}

// served is rt as the proxy serves it: a Stripe route's key is the event's
// "id", and its pending_webhooks (a count that changes between deliveries)
// is not part of the command.
func (rt Route) served() Route {
	if rt.Webhook == WebhookStripe {
		rt.KeyField = "/id"
		if !slices.Contains(rt.Ignore, "/pending_webhooks") {
			rt.Ignore = append(slices.Clip(rt.Ignore), "/pending_webhooks")
		}
	}
	return rt
}

// window is rt's replay window (0: the engine's default).
func (rt Route) window() time.Duration {
	if rt.Window == 0 && rt.Webhook != "" {
		return DefaultWebhookWindow
	}
	return rt.Window
}

// verifier checks the signatures of a webhook route's deliveries.
type verifier struct {
	kind      string
	tolerance time.Duration
	// standard are the route's secrets for WebhookStandard, stripe for
	// WebhookStripe.
	standard []*standardwebhooks.Webhook
	stripe   []string
	now      func() time.Time
	// reject counts a refused delivery by reason; never nil.
	reject func(reason string)
}

// MaxWebhookSecrets bounds the secrets of a webhook route's file: one in
// use and the ones a rotation adds.
const MaxWebhookSecrets = 8

// newVerifier reads rt's secret file. Its errors name the file and the
// line, never a secret.
func newVerifier(rt Route, logger *slog.Logger, metrics any) (*verifier, error) {
	if err := rt.checkWebhook(); err != nil {
		return nil, err
	}
	secrets, warn, err := cli.ReadSecretsFile(rt.WebhookSecretFile)
	if err != nil {
		return nil, fmt.Errorf("webhook-secret-file: %w", err)
	}
	if warn != "" {
		logger.Warn(warn)
	}
	if len(secrets) > MaxWebhookSecrets {
		return nil, fmt.Errorf("webhook-secret-file %s holds %d secrets; at most %d", rt.WebhookSecretFile, len(secrets), MaxWebhookSecrets)
	}
	v := &verifier{kind: rt.Webhook, tolerance: rt.WebhookTolerance, now: time.Now, reject: func(string) {}}
	if v.tolerance == 0 {
		v.tolerance = DefaultWebhookTolerance
	}
	for i, s := range secrets {
		switch rt.Webhook {
		case WebhookStandard:
			wh, err := standardwebhooks.NewWebhook(s)
			if err != nil {
				return nil, fmt.Errorf("webhook-secret-file %s, secret %d: want whsec_ and base64", rt.WebhookSecretFile, i+1)
			}
			v.standard = append(v.standard, wh)
		case WebhookStripe:
			v.stripe = append(v.stripe, s)
		}
	}
	if m, ok := metrics.(WebhookMetrics); ok {
		v.reject = m.WebhookRejections(rt.Operation)
	}
	return v, nil
}

// verify checks the signature headers of a delivery of body and returns
// the event's id for a Standard Webhooks route (a Stripe route's is in
// the body), or the reason it is refused.
func (v *verifier) verify(h http.Header, body []byte) (id, reason string) {
	switch v.kind {
	case WebhookStandard:
		return v.verifyStandard(h, body)
	default:
		return "", v.verifyStripe(h, body)
	}
}

func (v *verifier) verifyStandard(h http.Header, body []byte) (string, string) {
	ids, stamps, sigs := h.Values(standardwebhooks.HeaderWebhookID), h.Values(standardwebhooks.HeaderWebhookTimestamp), h.Values(standardwebhooks.HeaderWebhookSignature)
	if len(ids) == 0 || len(stamps) == 0 || len(sigs) == 0 {
		return "", "unsigned"
	}
	// The library reads the first of each: a second one would be a value
	// nobody verified.
	if len(ids) > 1 || len(stamps) > 1 || len(sigs) > 1 {
		return "", "malformed"
	}
	ts, err := strconv.ParseInt(stamps[0], 10, 64)
	if err != nil {
		return "", "malformed"
	}
	matched := false
	for _, wh := range v.standard {
		// The library's own tolerance (5 minutes, on time.Now) is not the
		// route's: the timestamp is checked below.
		if wh.VerifyIgnoringTimestamp(body, h) == nil {
			matched = true
			break
		}
	}
	if !matched {
		return "", "mismatch"
	}
	if !v.fresh(ts) {
		return "", "stale"
	}
	return ids[0], ""
}

func (v *verifier) verifyStripe(h http.Header, body []byte) string {
	sigs := h.Values("Stripe-Signature")
	switch {
	case len(sigs) == 0:
		return "unsigned"
	case len(sigs) > 1:
		return "malformed"
	}
	matched := false
	for _, secret := range v.stripe {
		// The tolerance is the route's, on the proxy's clock, both ways:
		// checked below.
		err := stripewebhook.ValidatePayloadIgnoringTolerance(body, sigs[0], secret)
		switch {
		case err == nil:
			matched = true
		case errors.Is(err, stripewebhook.ErrNotSigned):
			return "unsigned"
		case errors.Is(err, stripewebhook.ErrInvalidHeader):
			return "malformed"
		}
		if matched {
			break
		}
	}
	if !matched {
		return "mismatch"
	}
	// The header verified, so it parses: its signed timestamp is its last
	// t=, as the library reads it.
	var ts int64
	for _, pair := range strings.Split(sigs[0], ",") {
		if k, val, _ := strings.Cut(pair, "="); k == "t" {
			ts, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	if !v.fresh(ts) {
		return "stale"
	}
	return ""
}

// fresh reports whether the signed Unix time ts is within the tolerance of
// now, either way.
func (v *verifier) fresh(ts int64) bool {
	now := v.now()
	t := time.Unix(ts, 0)
	return now.Sub(t) <= v.tolerance && t.Sub(now) <= v.tolerance
}

type webhookVerifiedKey struct{}

// VerifyWebhook checks the signature of r, a delivery to the webhook route
// of operation, before anything is stored: it reads the body (bounded by
// Options.MaxBodyBytes) and returns r with the body readable again, the
// event's id as its idempotency key, and a mark that the route's handler
// finds, so that it does not check it again. Its error is the answer: 401
// WEBHOOK_SIGNATURE_INVALID (counted by WebhookMetrics and logged with
// its reason, never the request's content) or 413 REQUEST_BODY_TOO_LARGE.
// The route's handler verifies every delivery itself; a node calls
// VerifyWebhook first because a verified signature is what admits a
// sender that has no bearer token, before the node routes the delivery to
// its tenant's home region.
func (p *Proxy) VerifyWebhook(operation string, r *http.Request) (*http.Request, error) {
	for _, rt := range p.routes {
		if rt.Operation == operation && rt.webhook != nil {
			return p.verifyWebhook(rt, r)
		}
	}
	return nil, fmt.Errorf("sidecar: no webhook route has operation %q", operation)
}

func (p *Proxy) verifyWebhook(rt *route, r *http.Request) (*http.Request, error) {
	if err := idemhttp.CheckContentLength(r, p.opts.MaxBodyBytes); err != nil {
		return nil, err
	}
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, p.opts.MaxBodyBytes+1))
		var ie *idem.Error
		switch {
		case errors.As(err, &ie):
			// The server's body reader said why (a read deadline, say).
			return nil, ie
		case err != nil:
			return nil, &idem.Error{Code: idem.ECodeRequestMalformed, Message: "The body could not be read.", Err: err}
		case int64(len(b)) > p.opts.MaxBodyBytes:
			return nil, idem.Errorf(idem.ECodeBodyTooLarge, "The body is larger than %d bytes.", p.opts.MaxBodyBytes)
		}
		body = b
	}
	id, reason := rt.webhook.verify(r.Header, body)
	if reason != "" {
		rt.webhook.reject(reason)
		p.opts.Logger.WarnContext(r.Context(), "sidecar webhook delivery refused", "operation", rt.Operation, "reason", reason)
		return nil, errWebhookSignature
	}
	r = r.WithContext(context.WithValue(r.Context(), webhookVerifiedKey{}, rt.Operation))
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	r.Header.Del(idemhttp.HeaderKey)
	if id != "" {
		r.Header.Set(idemhttp.HeaderKey, quoteKey(id))
	}
	return r, nil
}

// checkWebhook verifies the deliveries to a webhook route that were not
// verified for it already (VerifyWebhook) before next reads or stores
// anything.
func (p *Proxy) checkWebhook(rt *route, next http.Handler) http.Handler {
	if rt.webhook == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if op, _ := r.Context().Value(webhookVerifiedKey{}).(string); op == rt.Operation {
			next.ServeHTTP(w, r)
			return
		}
		verified, err := p.verifyWebhook(rt, r)
		if err != nil {
			rt.errors.Write(w, r, p.opts.Logger, err)
			return
		}
		next.ServeHTTP(w, verified)
	})
}

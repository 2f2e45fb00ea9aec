package region_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	stripewebhook "github.com/stripe/stripe-go/v84/webhook"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
)

// webhookSecrets writes a Standard Webhooks secret and a Stripe secret,
// each to a file of its own, and returns them and the files.
func webhookSecrets(t *testing.T) (std, stripe, stdFile, stripeFile string) {
	t.Helper()
	b := make([]byte, 56)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	std, stripe = "whsec_"+base64.StdEncoding.EncodeToString(b[:32]), "whsec_"+base64.RawURLEncoding.EncodeToString(b[32:])
	dir := t.TempDir()
	stdFile, stripeFile = filepath.Join(dir, "standard"), filepath.Join(dir, "stripe")
	for file, secret := range map[string]string{stdFile: std, stripeFile: stripe} {
		if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return std, stripe, stdFile, stripeFile
}

func webhookRoutes(t *testing.T, upstream, stdFile, stripeFile string) region.SidecarConfig {
	t.Helper()
	routes, err := sidecar.ParseRoutes("POST /hooks/standard=receive_standard@" + upstream + ";webhook=standard;webhook-secret-file=" + stdFile + ";webhook-tenant=tenant-a;wait=10s," +
		"POST /hooks/stripe=receive_stripe@" + upstream + ";webhook=stripe;webhook-secret-file=" + stripeFile + ";webhook-tenant=tenant-a;wait=10s")
	if err != nil {
		t.Fatal(err)
	}
	return region.SidecarConfig{Routes: routes}
}

// deliver posts an event as its sender does: no bearer token, the
// signature headers of h.
func deliver(t *testing.T, client *http.Client, url string, h http.Header, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// standardDelivery is a Standard Webhooks delivery signed by the
// library at ts.
func standardDelivery(t *testing.T, secret, id string, ts time.Time, body string) http.Header {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {strconv.FormatInt(ts.Unix(), 10)}, "Webhook-Signature": {sig}}
}

// stripeDelivery is a Stripe delivery signed by stripe-go at ts.
func stripeDelivery(secret string, ts time.Time, body string) http.Header {
	p := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: []byte(body), Secret: secret, Timestamp: ts})
	return http.Header{"Stripe-Signature": {p.Header}}
}

func stripeEventBody(id string, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_1","amount":2000}},"pending_webhooks":%d}`, id, pending)
}

// TestWebhookRedeliveriesAcrossRegions: a Standard Webhooks sender and a
// Stripe sender each redeliver one event five times at once, re-signed
// every time, to both regions: the node that receives a delivery verifies
// its signature (no bearer token) and forwards it to the tenant's home
// region, which executes each event once and alone stores its record;
// every delivery gets the first answer. A forged or expired delivery, at
// either region, is 401 and stores nothing in either.
func TestWebhookRedeliveriesAcrossRegions(t *testing.T) {
	c := newFwdCluster(t, false)
	up := newCountingUpstream(t)
	std, stripe, stdFile, stripeFile := webhookSecrets(t)
	peer := []byte("s3cret-peer")
	eu := c.start("eu-west", region.Config{PeerSecret: peer, Sidecar: webhookRoutes(t, up.url, stdFile, stripeFile)})
	us := c.start("us-east", region.Config{PeerSecret: peer, Sidecar: webhookRoutes(t, up.url, stdFile, stripeFile)})
	const stdID, stripeID = "msg_across_regions", "evt_across_regions"
	stdBody := `{"type":"invoice.paid","data":{"invoice":"in_7","amount":"12.00"}}`

	answers := make([]answer, 10)
	var wg sync.WaitGroup
	now := time.Now()
	for i := range 5 {
		node := us
		if i%2 == 1 {
			node = eu
		}
		ts := now.Add(-time.Duration(i*20) * time.Second)
		wg.Go(func() {
			answers[i] = deliver(t, c.client, node.url+"/hooks/standard", standardDelivery(t, std, stdID, ts, stdBody), stdBody)
		})
		body := stripeEventBody(stripeID, 5-i)
		wg.Go(func() {
			answers[5+i] = deliver(t, c.client, node.url+"/hooks/stripe", stripeDelivery(stripe, ts, body), body)
		})
	}
	wg.Wait()
	for i, a := range answers {
		first := answers[i/5*5]
		if a.status != http.StatusCreated || string(a.body) != string(first.body) {
			t.Errorf("delivery %d: %d %s, want 201 %s", i, a.status, a.body, first.body)
		}
	}
	runs, last := up.snapshot()
	stdKey, stripeKey := sidecar.DerivedKey("tenant-a", "receive_standard", stdID, 0), sidecar.DerivedKey("tenant-a", "receive_stripe", stripeID, 0)
	if len(runs) != 2 || runs[stdKey] != 1 || runs[stripeKey] != 1 {
		t.Errorf("upstream runs %v, want one under %s and one under %s", runs, stdKey, stripeKey)
	}
	if last.Get("Idem-Tenant") != "tenant-a" || last.Get(region.HeaderForwardedBy) != "" || last.Get(region.HeaderPeerSecret) != "" {
		t.Errorf("upstream headers %v", last)
	}
	if records(t, eu) != 2 || records(t, us) != 0 {
		t.Errorf("records: home %d, forwarder %d; want 2, 0", records(t, eu), records(t, us))
	}

	for _, node := range []*fwdNode{us, eu} {
		for name, d := range map[string]struct {
			path   string
			header http.Header
			body   string
		}{
			"standard forged":   {"/hooks/standard", standardDelivery(t, "whsec_"+base64.StdEncoding.EncodeToString([]byte("not the route's secret")), "msg_forged", time.Now(), stdBody), stdBody},
			"standard expired":  {"/hooks/standard", standardDelivery(t, std, "msg_expired", time.Now().Add(-time.Hour), stdBody), stdBody},
			"stripe forged":     {"/hooks/stripe", stripeDelivery("whsec_guess", time.Now(), stripeEventBody("evt_forged", 1)), stripeEventBody("evt_forged", 1)},
			"stripe expired":    {"/hooks/stripe", stripeDelivery(stripe, time.Now().Add(-time.Hour), stripeEventBody("evt_expired", 1)), stripeEventBody("evt_expired", 1)},
			"bearer token only": {"/hooks/standard", http.Header{"Authorization": {"Bearer tok-a"}, "Webhook-Id": {"msg_bearer"}}, stdBody},
		} {
			if a := deliver(t, c.client, node.url+d.path, d.header, d.body); a.status != http.StatusUnauthorized || a.code() != idem.ECodeWebhookSignatureInvalid {
				t.Errorf("%s at %s: %d %s, want 401 %s", name, node.url, a.status, a.body, idem.ECodeWebhookSignatureInvalid)
			}
		}
	}
	if records(t, eu) != 2 || records(t, us) != 0 {
		t.Errorf("records after the forgeries: home %d, forwarder %d; want 2, 0", records(t, eu), records(t, us))
	}
	if runs, _ := up.snapshot(); len(runs) != 2 {
		t.Errorf("upstream runs after the forgeries %v", runs)
	}

	// A client of the cluster cannot pass for a forwarding peer: a
	// delivery claiming to be forwarded, without the peer's credentials,
	// is refused.
	h := http.Header{region.HeaderForwardedBy: {"eu-west/eu-west-0; hops=1"}, region.HeaderTenant: {"tenant-a"}}
	if a := deliver(t, c.client, eu.url+"/hooks/standard", h, stdBody); a.status != http.StatusForbidden {
		t.Errorf("a client's forwarded delivery: %d %s", a.status, a.body)
	}
}

// TestWebhookTenantNeedsAToken: a webhook route's tenant must be one of the
// node's tenants (its deliveries are forwarded between regions as that
// tenant's); one without a token stops the start.
func TestWebhookTenantNeedsAToken(t *testing.T) {
	st, _ := storetest.New(t)
	pay := payments.NewService(st, payments.Config{Region: "test"})
	_, _, stdFile, _ := webhookSecrets(t)
	routes, err := sidecar.ParseRoutes("POST /hooks=receive@http://127.0.0.1:1;webhook=standard;webhook-secret-file=" + stdFile + ";webhook-tenant=tenant-z")
	if err != nil {
		t.Fatal(err)
	}
	cfg := region.Config{Tokens: map[string]string{"tok-a": "tenant-a"}, Sidecar: region.SidecarConfig{Routes: routes}}
	if _, err := region.NewServer(cfg, st, paymentsnode.Operation(pay, paymentsnode.Outbox{})); err == nil {
		t.Error("NewServer accepted a webhook route of a tenant without a token")
	}
	cfg.Tokens["tok-z"] = "tenant-z"
	srv, err := region.NewServer(cfg, st, paymentsnode.Operation(pay, paymentsnode.Outbox{}))
	if err != nil {
		t.Fatalf("NewServer with the tenant's token: %v", err)
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Error(err)
	}
}

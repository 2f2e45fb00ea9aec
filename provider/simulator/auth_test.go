package simulator

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemcoord/idem/provider"
)

// TestKeys: with keys configured, charges need the API key and the admin
// endpoints the admin key (neither accepts the other's), a missing or wrong
// key is refused with 401 UNAUTHENTICATED before anything happens, and the
// client sends each key where it belongs.
func TestKeys(t *testing.T) {
	const apiKey, adminKey = "api-key-0123456789", "admin-key-0123456789"
	srv, err := NewServer(Config{APIKey: apiKey, AdminKey: adminKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	cases := []struct {
		method, path, key string
		want              int
	}{
		{"GET", "/healthz", "", 200},
		{"GET", "/v1/charges/provider_payment_p1", "", 401},
		{"GET", "/v1/charges/provider_payment_p1", "wrong", 401},
		{"GET", "/v1/charges/provider_payment_p1", apiKey + "x", 401},
		{"GET", "/v1/charges/provider_payment_p1", adminKey, 401},
		{"GET", "/v1/charges/provider_payment_p1", apiKey, 404},
		{"POST", "/v1/charges", "", 401},
		{"GET", "/admin/charges", "", 401},
		{"GET", "/admin/charges", apiKey, 401},
		{"GET", "/admin/charges", adminKey, 200},
		{"PUT", "/admin/fault", apiKey, 401},
		{"GET", "/admin/fault", adminKey, 200},
	}
	for _, tc := range cases {
		rq, _ := http.NewRequestWithContext(ctxT(t), tc.method, ts.URL+tc.path, strings.NewReader(`{"mode":"fail"}`))
		if tc.key != "" {
			rq.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := ts.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with key %q = %d, want %d", tc.method, tc.path, tc.key, resp.StatusCode, tc.want)
		}
	}
	if srv.Fault().Mode != provider.FaultNone {
		t.Errorf("a refused PUT /admin/fault changed the fault to %+v", srv.Fault())
	}

	// The client sends each key to its endpoints.
	c := &provider.Client{BaseURL: ts.URL, HTTP: ts.Client(), APIKey: apiKey, AdminKey: adminKey}
	if _, err := c.Charge(ctxT(t), req("p1")); err != nil {
		t.Errorf("Charge with the API key: %v", err)
	}
	if err := c.SetFault(ctxT(t), provider.Fault{Mode: provider.FaultNone}); err != nil {
		t.Errorf("SetFault with the admin key: %v", err)
	}
	if cc, err := c.Charges(ctxT(t)); err != nil || cc.Total != 1 {
		t.Errorf("Charges = %+v, %v; want 1", cc, err)
	}

	// A refused key is a configuration error: nothing was charged, so it
	// is also ErrUnavailable (payments answer 503 and may retry).
	noKey := &provider.Client{BaseURL: ts.URL, HTTP: ts.Client()}
	_, err = noKey.Charge(ctxT(t), req("p2"))
	if !errors.Is(err, provider.ErrUnauthorized) || !errors.Is(err, provider.ErrUnavailable) || errors.Is(err, provider.ErrAmbiguous) {
		t.Errorf("Charge without a key: %v, want ErrUnauthorized and ErrUnavailable", err)
	}
	if _, err := noKey.Charges(ctxT(t)); !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("Charges without the admin key: %v, want ErrUnauthorized", err)
	}
	if cc, _ := c.Charges(ctxT(t)); cc.Total != 1 {
		t.Errorf("charges after refused requests: %d, want 1", cc.Total)
	}
}

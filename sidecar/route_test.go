package sidecar_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/idemcoord/idem/sidecar"
)

func TestParseRoutes(t *testing.T) {
	routes, err := sidecar.ParseRoutes(" POST /transfers=create_transfer@http://127.0.0.1:9000 ," +
		"PUT /v2/orders=put_order@https://up.example/base;lookup=https://up.example/orders/by-key/{derivedKey}?full=1;header=api-tenant-version;timeout=5s," +
		"DELETE /x=del@http://h;idempotent-upstream")
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 3 {
		t.Fatalf("routes = %v", routes)
	}
	r := routes[1]
	if r.Method != "PUT" || r.Prefix != "/v2/orders" || r.Operation != "put_order" || r.Upstream.String() != "https://up.example/base" ||
		r.Lookup != "https://up.example/orders/by-key/{derivedKey}?full=1" || !reflect.DeepEqual(r.SemanticHeaders, []string{"Api-Tenant-Version"}) ||
		r.Timeout != 5*time.Second || r.IdempotentUpstream {
		t.Errorf("route = %+v", r)
	}
	if !routes[2].IdempotentUpstream || routes[0].Timeout != sidecar.DefaultTimeout {
		t.Errorf("routes = %+v", routes)
	}
	if !routes[0].Matches("POST", "/transfers") || !routes[0].Matches("POST", "/transfers/a/b") ||
		routes[0].Matches("POST", "/transfersx") || routes[0].Matches("GET", "/transfers") {
		t.Error("Matches")
	}
	if got, err := sidecar.ParseRoutes(""); err != nil || got != nil {
		t.Errorf("empty: %v %v", got, err)
	}
}

func TestParseRouteOptions(t *testing.T) {
	routes, err := sidecar.ParseRoutes("POST /v1/charges=create_charge@http://127.0.0.1:9000;wait=10s;ignore=/meta/sent_at;ignore=request_time;" +
		"key-field=/idempotency_key;replay-header=x-request-id;pass-authorization;max-response=2048;unknown-status=503")
	if err != nil {
		t.Fatal(err)
	}
	r := routes[0]
	if r.Prefix != "/v1/charges" || r.Wait != 10*time.Second || !reflect.DeepEqual(r.Ignore, []string{"/meta/sent_at", "request_time"}) ||
		r.KeyField != "/idempotency_key" || !reflect.DeepEqual(r.ReplayHeaders, []string{"X-Request-Id"}) || !r.PassAuthorization ||
		r.MaxResponse != 2048 || r.UnknownStatus != 503 {
		t.Errorf("route = %+v", r)
	}
	again, err := sidecar.ParseRoutes(r.String())
	if err != nil || !reflect.DeepEqual(again[0], r) {
		t.Errorf("%q parses back to %+v, %v", r.String(), again, err)
	}
}

func TestParseRoutesRejects(t *testing.T) {
	for _, s := range []string{
		"POST /t=op",                          // no upstream
		"POST /t@http://h",                    // no operation
		"GET /t=op@http://h",                  // a safe method
		"post /t=op@http://h",                 // lowercase
		"POST t=op@http://h",                  // relative prefix
		"POST /=op@http://h",                  // root
		"POST /t/=op@http://h",                // trailing slash
		"POST /a/../b=op@http://h",            // dot segment
		"POST /a//b=op@http://h",              // empty segment
		"POST /{x}=op@http://h",               // pattern syntax
		"POST /t=Op@http://h",                 // uppercase operation
		"POST /t=op@ftp://h",                  // scheme
		"POST /t=op@http://",                  // no host
		"POST /t=op@http://u:p@h",             // user information
		"POST /t=op@http://h?q=1",             // query
		"POST /t=op@http://h#f",               // fragment
		"POST /t=op@http://h;lookup=http://h", // no {derivedKey}
		"POST /t=op@http://h;timeout=0s",
		"POST /t=op@http://h;timeout=2h",
		"POST /t=op@http://h;header=a b",
		"POST /t=op@http://h;retry",
		"POST /t=op@http://h;wait=-1s",
		"POST /t=op@http://h;wait=2m",
		"POST /t=op@http://h;ignore=",
		"POST /t=op@http://h;ignore=a b",
		"POST /t=op@http://h;key-field=a;key-field=b",
		"POST /t=op@http://h;replay-header=a:b",
		"POST /t=op@http://h;pass-authorization=yes",
		"POST /t=op@http://h;unknown-status=500",
		"POST /t=op@http://h;unknown-status",
		"POST /t=op@http://h;max-response",
		"POST /t=op@http://h;max-response=",
		"POST /t=op@http://h;max-response=0",
		"POST /t=op@http://h;max-response=-1",
		"POST /t=op@http://h;max-response=+1",
		"POST /t=op@http://h;max-response=1k",
		"POST /t=op@http://h;max-response=1MiB",
		"POST /t=op@http://h;max-response=67108865",
		"POST /t=op@http://h;max-response=1;max-response=2",
		"POST /t=op@http://h,POST /u=op@http://h", // operation twice
		"POST /t=a@http://h,POST /t=b@http://h",   // route twice
	} {
		if _, err := sidecar.ParseRoutes(s); err == nil {
			t.Errorf("ParseRoutes(%q) accepted", s)
		}
	}
}

// FuzzParseRoutes: the parser never panics, and what it accepts prints
// back (Route.String) to the same routes.
func FuzzParseRoutes(f *testing.F) {
	for _, s := range []string{
		"POST /transfers=create_transfer@http://127.0.0.1:9000",
		"PUT /v2/orders=put_order@https://up.example/base;lookup=https://up.example/o/{derivedKey};header=X-A;timeout=5s,DELETE /x=d@http://h;idempotent-upstream",
		"POST /t=op@http://h;lookup=http://h/{derivedKey}%zz",
		"PATCH /a.b/~c=a.b-c_d@http://[::1]:80/p/",
		"POST /t=op@http://h;max-response=0001048576;pass-authorization",
		"POST /hooks=receive@http://h;webhook=stripe;webhook-secret-file=/s;webhook-tenant=acme;webhook-tolerance=90s;window=72h",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		routes, err := sidecar.ParseRoutes(s)
		if err != nil {
			return
		}
		for _, r := range routes {
			again, err := sidecar.ParseRoutes(r.String())
			if err != nil || len(again) != 1 || again[0].String() != r.String() {
				t.Fatalf("%q printed as %q, which parses to %v (%v)", s, r.String(), again, err)
			}
			if !sidecar.ValidOperation(r.Operation) || !r.Matches(r.Method, r.Prefix) || len(r.Patterns()) != 2 {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}

func TestUnknownStatusRoundTrip(t *testing.T) {
	for _, s := range []string{"POST /t=op@http://h;unknown-status=202", "POST /t=op@http://h;unknown-status=503", "POST /t=op@http://h"} {
		routes, err := sidecar.ParseRoutes(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := sidecar.ParseRoutes(routes[0].String())
		if err != nil || !reflect.DeepEqual(again[0], routes[0]) {
			t.Errorf("%q prints as %q, which parses to %+v, %v", s, routes[0].String(), again, err)
		}
	}
}

package region_test

import (
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/sidecar"
)

// openAPIDoc is the part of docs/openapi.yaml the tests check.
type openAPIDoc struct {
	Paths      map[string]map[string]any `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Enum []string `json:"enum"`
		} `json:"schemas"`
	} `json:"components"`
	Sidecar struct {
		Errors []string `json:"errors"`
	} `json:"x-idem-sidecar"`
}

func readOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	raw, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	return doc
}

// documentedRoutes lists "METHOD /path" for every operation of doc's paths.
func (doc openAPIDoc) documentedRoutes() []string {
	var out []string
	for path, item := range doc.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(out)
	return out
}

// routeDiff returns the routes served but not documented, and documented
// but not served.
func routeDiff(served, documented []string) (undocumented, unserved []string) {
	for _, r := range served {
		if !slices.Contains(documented, r) {
			undocumented = append(undocumented, r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			unserved = append(unserved, r)
		}
	}
	return undocumented, unserved
}

func openAPITestServer(t *testing.T, ops ...region.Operation) *region.Server {
	t.Helper()
	st, _ := storetest.New(t)
	pay := payments.NewService(st, payments.Config{Region: "test", Window: time.Hour})
	srv, err := region.NewServer(region.Config{Region: "test", Tokens: map[string]string{"tok-a": "tenant-a"}}, st, append([]region.Operation{paymentsnode.Operation(pay, paymentsnode.Outbox{})}, ops...)...)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestOpenAPIDocumentsEveryRoute: docs/openapi.yaml documents exactly the
// endpoints a node with payments registers, each with its method.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc := readOpenAPI(t)
	served := openAPITestServer(t).Routes()
	if len(served) < 10 {
		t.Fatalf("the node lists only %d routes: %v", len(served), served)
	}
	undocumented, unserved := routeDiff(served, doc.documentedRoutes())
	if len(undocumented) > 0 {
		t.Errorf("routes the node serves that docs/openapi.yaml does not document: %v", undocumented)
	}
	if len(unserved) > 0 {
		t.Errorf("routes docs/openapi.yaml documents that the node does not serve: %v", unserved)
	}
}

// TestOpenAPICheckCatchesAnUndocumentedRoute: a route added to the node
// without documentation is reported by the check above.
func TestOpenAPICheckCatchesAnUndocumentedRoute(t *testing.T) {
	extra := region.Operation{Name: "create_widget", Routes: func(*region.Server) []region.Route {
		return []region.Route{{Pattern: "POST /widgets", Handler: func(w http.ResponseWriter, _ *http.Request, _ string) {}}}
	}}
	served := openAPITestServer(t, extra).Routes()
	undocumented, _ := routeDiff(served, readOpenAPI(t).documentedRoutes())
	if !slices.Equal(undocumented, []string{"POST /widgets"}) {
		t.Errorf("undocumented = %v, want [POST /widgets]", undocumented)
	}
}

// TestOpenAPIErrorCodesMatchStatusTable: the ErrorCode enum is exactly the
// codes of the status table, and the sidecar's documented errors are in it.
func TestOpenAPIErrorCodesMatchStatusTable(t *testing.T) {
	doc := readOpenAPI(t)
	enum := doc.Components.Schemas["ErrorCode"].Enum
	if len(enum) == 0 {
		t.Fatal("docs/openapi.yaml has no ErrorCode enum")
	}
	table := openAPITestServer(t).Errors() // a node serving payments
	for _, code := range append(slices.Clone(enum), doc.Sidecar.Errors...) {
		if !slices.Contains(table.Codes(), code) {
			t.Errorf("docs/openapi.yaml names %s, which the status table does not have", code)
		}
	}
	for _, code := range table.Codes() {
		if !slices.Contains(enum, code) {
			t.Errorf("the status table's %s is missing from docs/openapi.yaml's ErrorCode enum", code)
		}
	}
}

// TestRoutesListProxiedRoutes: Routes includes the sidecar's routes, which
// are configuration and documented by x-idem-sidecar instead of paths; they
// are the only routes the check would find undocumented.
func TestRoutesListProxiedRoutes(t *testing.T) {
	routes, err := sidecar.ParseRoutes("POST /transfers=create_transfer@http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := storetest.New(t)
	srv, err := region.NewServer(region.Config{Region: "test", Sidecar: region.SidecarConfig{Routes: routes}}, st)
	if err != nil {
		t.Fatal(err)
	}
	undocumented, _ := routeDiff(srv.Routes(), readOpenAPI(t).documentedRoutes())
	if want := routes[0].Patterns(); !slices.Equal(undocumented, want) || len(want) == 0 {
		t.Errorf("undocumented routes = %v, want the proxied route's patterns %v", undocumented, want)
	}
}

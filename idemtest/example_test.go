package idemtest_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/idemcoord/idem/idemtest"
)

// A user's integration test: start two regions, send a payment through the
// region that is not the tenant's home (it is forwarded there), then retry
// it through the home region, which replays the stored answer. In a test,
// call idemtest.Cleanup(t, c) instead of the deferred Terminate, and skip
// when idemtest.Available fails. Needs the images of `idemctl images
// build` and TESTCONTAINERS_RYUK_DISABLED=true where nothing can be pulled.
func Example() {
	ctx := context.Background()
	if err := idemtest.Available(ctx); err != nil {
		log.Print(err) // a test would t.Skip(err)
		return
	}
	c, err := idemtest.Run(ctx, idemtest.WithRegions("eu-west", "us-east"))
	defer func() {
		if err := c.Terminate(context.Background()); err != nil {
			log.Print(err)
		}
	}()
	if err != nil {
		log.Print(err)
		return
	}
	pay := func(region string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(region)+"/payments",
			strings.NewReader(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"invoice-7781"}`))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.Tokens["tenant-a"]) // tenant-a's home: eu-west
		req.Header.Set("Idempotency-Key", "order-7781")
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}
	for _, region := range []string{"us-east", "eu-west"} {
		resp, err := pay(region)
		if err != nil {
			log.Print(err)
			return
		}
		resp.Body.Close()
		fmt.Println(region, resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
}

// TestExample runs Example against real containers and checks what it
// prints: the forwarded first attempt creates the payment, the retry
// through the home region replays it. (Example has no Output comment
// because it needs a Docker engine and the images; this test skips, in one
// line, without them.)
func TestExample(t *testing.T) {
	if err := idemtest.Available(t.Context()); err != nil {
		t.Skip(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		out <- b
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		Example()
	}()
	w.Close()
	got := string(<-out)
	if want := "us-east 201 replayed: false\neu-west 201 replayed: true\n"; got != want {
		t.Errorf("Example printed %q, want %q", got, want)
	}
}

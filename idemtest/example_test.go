package idemtest_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"strings"

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

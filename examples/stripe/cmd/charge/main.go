// Command charge creates one charge with the official Stripe Go SDK
// (stripe-go) through an idemd node's sidecar, and prints every attempt of
// the SDK's retry loop and the result:
//
//	charge -key order-1001 -amount 2000
//
// By default it reads .state/cluster.json (written by idemctl up), takes the
// tenant's dev token as the Stripe API key and sends to the first region
// that is not the tenant's home, so the node forwards the call. IDEM_TOKEN
// and -url override the token and the node (a token is never a flag: a
// command line is visible to every local user).
//
// It exits 0 for a charge, 1 for an API error (a decline, a 409) and 2 for
// a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/stripe/stripe-go/v84"

	"github.com/idemcoord/idem/examples/stripe/stripeclient"
)

// clusterInfo is the part of idemctl up's cluster.json this program reads.
type clusterInfo struct {
	Regions []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	} `json:"regions"`
	Tokens     map[string]string `json:"tokens"`
	Placements map[string]string `json:"placements"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("charge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", ".state/cluster.json", "idemctl up's cluster.json: the tenant's token and the nodes")
	tenant := fs.String("tenant", "tenant-a", "tenant whose token is the Stripe API key")
	nodeURL := fs.String("url", "", "node base URL (default: the first region of cluster.json that is not the tenant's home)")
	key := fs.String("key", "", "Idempotency-Key (default: the SDK makes one per call, <UnixNano>_<random>)")
	amount := fs.Int64("amount", 2000, "amount in the currency's minor unit")
	currency := fs.String("currency", "usd", "currency")
	source := fs.String("source", "tok_visa", "payment source (tok_chargeDeclined: a declined card)")
	description := fs.String("description", "walkthrough order", "description")
	delay := fs.Int("delay-ms", 0, "ask the fake upstream to answer this many milliseconds late (metadata[delay_ms])")
	failOnce := fs.String("fail-once", "", "ask the fake upstream to fail this key's first call: plain or api_error (a 500), or drop (charge, then close the connection unanswered) (metadata[fail_once])")
	timeout := fs.Duration("timeout", 80*time.Second, "the SDK's HTTP client timeout, per attempt")
	retries := fs.Int64("retries", 2, "the SDK's MaxNetworkRetries")
	verbose := fs.Bool("v", false, "print the SDK's own log lines too")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, "charge: no arguments, only flags")
		return 2
	}

	token := os.Getenv("IDEM_TOKEN")
	if token == "" || *nodeURL == "" {
		info, err := readState(*state)
		if err != nil {
			fmt.Fprintf(stderr, "charge: %v (start a cluster with idemctl up --state-dir .state, or set IDEM_TOKEN and -url)\n", err)
			return 2
		}
		if token == "" {
			if token = info.Tokens[*tenant]; token == "" {
				fmt.Fprintf(stderr, "charge: %s has no token for %s\n", *state, *tenant)
				return 2
			}
		}
		if *nodeURL == "" {
			home := info.Placements[*tenant]
			for _, r := range info.Regions {
				if r.Name != home {
					*nodeURL = r.URL
					fmt.Fprintf(stdout, "%s's home is %s; sending to %s (%s), which forwards\n", *tenant, home, r.Name, r.URL)
					break
				}
			}
			if *nodeURL == "" {
				fmt.Fprintf(stderr, "charge: %s lists no region besides %s's home\n", *state, *tenant)
				return 2
			}
		}
	}

	rec := &stripeclient.Recorder{Log: func(a stripeclient.Attempt) { fmt.Fprintf(stdout, "attempt: %v\n", a) }}
	cfg := stripeclient.Config{URL: *nodeURL, Key: token, Timeout: *timeout, MaxNetworkRetries: *retries, Transport: rec}
	if *verbose {
		cfg.Logger = stripeclient.Logf(log.New(stderr, "", log.Ltime|log.Lmicroseconds).Printf)
	}
	sc := stripeclient.New(cfg)

	params := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(*amount),
		Currency:    stripe.String(*currency),
		Source:      &stripe.PaymentSourceSourceParams{Token: stripe.String(*source)},
		Description: stripe.String(*description),
	}
	if *delay > 0 {
		params.AddMetadata("delay_ms", fmt.Sprint(*delay))
	}
	if *failOnce != "" {
		params.AddMetadata("fail_once", *failOnce)
	}
	if *key != "" {
		params.SetIdempotencyKey(*key)
	}
	ch, err := sc.V1Charges.Create(context.Background(), params)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) {
			fmt.Fprintf(stdout, "error: HTTP %d type=%s code=%s decline_code=%s: %s (Idempotent-Replayed: %q)\n",
				se.HTTPStatusCode, se.Type, se.Code, se.DeclineCode, se.Msg, replayed(se.LastResponse))
		} else {
			fmt.Fprintf(stdout, "error (the body holds no Stripe error object: the SDK retries such an answer within -retries): %v\n", err)
		}
		return 1
	}
	if ch.ID == "" {
		fmt.Fprintf(stdout, "no charge: HTTP %d %s (the SDK reports no error for any answer below 400)\n", ch.LastResponse.StatusCode, ch.LastResponse.RawJSON)
		return 1
	}
	fmt.Fprintf(stdout, "charge %s: %d %s %s (Idempotent-Replayed: %q, Request-Id %s)\n",
		ch.ID, ch.Amount, ch.Currency, ch.Status, replayed(ch.LastResponse), ch.LastResponse.RequestID)
	return 0
}

func replayed(r *stripe.APIResponse) string {
	if r == nil {
		return ""
	}
	return r.Header.Get("Idempotent-Replayed")
}

func readState(path string) (clusterInfo, error) {
	var info clusterInfo
	b, err := os.ReadFile(path)
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("%s: %w", path, err)
	}
	return info, nil
}

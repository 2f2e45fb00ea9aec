// Command upstream serves package fakestripe's Stripe-like charges API on
// 127.0.0.1 (never another interface), the upstream of the Stripe
// walkthrough:
//
//	go build -o bin/fakestripe ./upstream && bin/fakestripe -port 12111
//
// It prints "fakestripe listening on http://127.0.0.1:PORT" once it serves
// and runs until SIGINT or SIGTERM. GET /_counts answers the executions per
// received Idempotency-Key, GET /_requests every request received.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/idemcoord/idem/examples/stripe/fakestripe"
)

func main() {
	port := flag.Int("port", 12111, "TCP port on 127.0.0.1 (0: any free port)")
	flag.Parse()
	if *port < 0 || *port > 65535 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: upstream [-port N]")
		os.Exit(2)
	}
	// Before the line that says it serves: a SIGINT right after it stops
	// the server instead of killing the process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	s := fakestripe.New()
	url, err := s.Start(net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("fakestripe listening on %s\n", url)
	<-sig
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

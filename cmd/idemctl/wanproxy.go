//go:build !operator

package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// runWANProxy serves toxiproxy's server (its HTTP API and the proxies it
// is asked for) until interrupted: the WAN container of the docker chaos
// environment (cluster.Config.Docker), which carries every link between
// the regions' networks. Its API is unauthenticated, as toxiproxy's is:
// it belongs on the test networks only.
func runWANProxy(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("wan-proxy", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:8474", "address of toxiproxy's HTTP API")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	logger := zerolog.New(env.Stderr).With().Timestamp().Logger().Level(zerolog.WarnLevel)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), logger)
	done := make(chan error, 1)
	go func() { done <- srv.Listen(*listen) }()
	fmt.Fprintf(env.Stderr, "wan-proxy: toxiproxy API on %s (pid %d)\n", *listen, os.Getpid())
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// Exiting closes every listener and connection at once; a graceful
		// stop would wait on connections a partition left silent.
		return nil
	}
}

package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"go.uber.org/zap"
)

// ErrUnavailable is wrapped by Available's error: no Docker engine, or an
// image it needs is not in the engine.
var ErrUnavailable = errors.New("idemtest: containers unavailable")

// Available reports whether Run can start a cluster from the given images
// (default DefaultIdemImage and DefaultPostgresImage): a Docker engine
// answers and has both images, since nothing is pulled. Its error names
// what is missing and how to get it, in one line, for a test to skip with.
func Available(ctx context.Context, images ...string) error {
	if len(images) == 0 {
		images = []string{DefaultIdemImage, DefaultPostgresImage}
	}
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("%w: no Docker engine (%v)", ErrUnavailable, err)
	}
	defer cli.Close()
	if _, err := cli.Info(ctx, client.InfoOptions{}); err != nil {
		return fmt.Errorf("%w: no Docker engine answers (%v)", ErrUnavailable, err)
	}
	for _, img := range images {
		if _, err := cli.ImageInspect(ctx, img); err != nil {
			return fmt.Errorf("%w: image %s is not in the Docker engine (build it: go run ./cmd/idemctl images build)", ErrUnavailable, img)
		}
	}
	if !testcontainers.ReadConfig().RyukDisabled {
		if _, err := cli.ImageInspect(ctx, reaperImage); err != nil {
			return fmt.Errorf("%w: testcontainers' reaper image %s is not in the Docker engine: set TESTCONTAINERS_RYUK_DISABLED=true", ErrUnavailable, reaperImage)
		}
	}
	return nil
}

// reaperImage is the Ryuk image testcontainers-go v0.45.0 starts unless
// Ryuk is disabled.
const reaperImage = "testcontainers/ryuk:0.14.0"

// testcontainersTestLogger adapts tb to testcontainers' logger.
func testcontainersTestLogger(tb testing.TB) tclog.Logger { return tclog.TestLogger(tb) }

// nopZap is the etcd client's logger: Run's errors say what failed.
func nopZap() *zap.Logger { return zap.NewNop() }

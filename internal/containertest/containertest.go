// Package containertest prepares a test binary for testcontainers-go on
// the machines this project's tests run on: no registry (so no Ryuk reaper
// image), and a Docker engine that may run in the test's own container.
package containertest

import (
	"net"
	"os"
)

// Setup is called by TestMain before m.Run. Variables already set win:
//
//   - TESTCONTAINERS_RYUK_DISABLED=true: the reaper's image cannot be
//     pulled; the tests remove what they start (idemtest.Cleanup).
//   - TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 when this process runs in a
//     container (/.dockerenv) whose own network namespace holds the
//     engine's docker0 bridge: the engine publishes container ports here,
//     while testcontainers would guess the container's default gateway.
func Setup() {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") != "" {
		return
	}
	if _, err := os.Stat("/.dockerenv"); err != nil {
		return
	}
	if _, err := net.InterfaceByName("docker0"); err == nil {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
}

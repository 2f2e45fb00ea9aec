// Package providertest starts the payment provider simulator
// (provider/simulator) over HTTP for a test, with a throwaway data
// directory, and returns its client.
package providertest

import (
	"net/http/httptest"
	"testing"

	"github.com/idemcoord/idem/provider"
	"github.com/idemcoord/idem/provider/simulator"
)

// Start serves a fresh simulator until tb ends and returns a client of it.
func Start(tb testing.TB) *provider.Client {
	tb.Helper()
	sim, err := simulator.NewServer(simulator.Config{DataDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	hs := httptest.NewServer(sim.Handler())
	tb.Cleanup(func() { hs.Close(); _ = sim.Close() })
	return &provider.Client{BaseURL: hs.URL}
}
